"""Where Keras 2 and TF1 call layers and losses: what the layer replay's taps wrap
(`verify.runners.capture.layer_taps`).

- Keras 2's `Layer.__call__` lives on `keras.src.engine.base_layer.Layer`; in a TF1 graph (and
  for TF1's `tf.compat.v1.layers`) Keras swaps in `keras.src.engine.base_layer_v1.Layer`, whose
  `__call__` is its own (it does not call the other's).
- A functional model's symbolic inputs are `keras.src.engine.keras_tensor.KerasTensor`s.
- `keras.src.losses.Loss.__call__` calls `self.call` (looked up on the instance) for the
  per-example losses, then reduces them.
- A feature-column layer (`DenseFeatures`, Keras' `_BaseFeaturesLayer`) concatenates one
  tensor per column in the order of its `_feature_columns`, and its `call` fills the dict
  `cols_to_output_tensors` it is given with those tensors, in that order.
- TF1's `tf.compat.v1.losses.*` functions reduce through the module-level
  `tensorflow.python.ops.losses.losses_impl.compute_weighted_loss`, called by name.
"""
from __future__ import annotations


def keras_layer_classes() -> tuple[type, ...]:
    """The classes whose own `__call__` runs every Keras 2 layer call (TF2 and TF1 graphs)."""
    from keras.src.engine import base_layer, base_layer_v1

    return (base_layer.Layer, base_layer_v1.Layer)


def keras_model_class() -> type:
    from keras.src.engine import training

    return training.Model


def keras_symbolic_tensor_class() -> type:
    from keras.src.engine.keras_tensor import KerasTensor

    return KerasTensor


def keras_loss_class() -> type:
    from keras.src import losses

    return losses.Loss


def tf1_losses_module():
    """The module whose `compute_weighted_loss` every `tf.compat.v1.losses` function calls."""
    from tensorflow.python.ops.losses import losses_impl

    return losses_impl


def is_feature_column_layer(layer) -> bool:
    from keras.src.feature_column.base_feature_layer import _BaseFeaturesLayer

    return isinstance(layer, _BaseFeaturesLayer)


def feature_column_key(column) -> str:
    """The feature a column reads: its categorical column's key (an embedding column) or its
    own key, else its name."""
    categorical = getattr(column, "categorical_column", None)
    return str(getattr(categorical, "key", None) or getattr(column, "key", None) or column.name)
