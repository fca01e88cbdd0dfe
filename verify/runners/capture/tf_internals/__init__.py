"""Every place the suite touches a private TensorFlow, Keras or tfrs detail, in one package.

Checked on TensorFlow 2.15.1, Keras 2.15.0 and tensorflow-recommenders 0.7.3. Each function
says what it relies on; when a TF upgrade breaks one, this package is the only place to
change. Its modules are grouped by what they reach:

- `optimizers`: TF1 and Keras optimizers (gradients applied, slots, hyperparameters);
- `embedding`: TPU embedding (tfrs layers, TPUEstimator's table slots, helper variables);
- `strategies`: `tf.distribute` strategies (collective keys, a multi-worker's local devices,
  the per-device input pipelines);
- `pipeline`: what a pipeline declares or writes (dataset graph, compiled loss, checkpoints);
- `global_state`: process-wide switches without a public getter (seeds, determinism, ...);
- `layers`: where Keras 2 and TF1 call layers and losses (the layer replay's taps).

Every function is importable from here, as the rest of the suite imports them. Importing this
package does not import TensorFlow.
"""
from __future__ import annotations

from verify.runners.capture.tf_internals.embedding import (
    TF1_TPU_DUMMY_TABLE_PREFIX, TFRS_TPU_HELPER, is_tpu_embedding_helper, tfrs_embedding_parts,
    tfrs_table_slots, tpu_embedding_slot_names)
from verify.runners.capture.tf_internals.global_state import (
    eager_by_default, global_generator, global_seed, grappler_options, keras_global_policy,
    op_determinism, set_eager_by_default, set_global_generator, set_global_seed,
    set_grappler_options, set_op_determinism)
from verify.runners.capture.tf_internals.layers import (
    feature_column_key, is_feature_column_layer, keras_layer_classes, keras_loss_class,
    keras_model_class, keras_symbolic_tensor_class, tf1_losses_module)
from verify.runners.capture.tf_internals.optimizers import (
    create_keras_optimizer_state, keras_optimizer_slots, optimizer_attributes,
    optimizer_gradient_tap, recording_tf1_apply_gradients, tf1_step_determined_state,
    wrapped_optimizer)
from verify.runners.capture.tf_internals.pipeline import (
    checkpoint_writes, compiled_user_loss, serialized_dataset_graph)
from verify.runners.capture.tf_internals.strategies import (
    fresh_collective_keys, multi_worker_cpu_replicas, untuned_per_device_input)

CHECKED_ON = {"tensorflow": "2.15.1", "keras": "2.15.0", "tensorflow-recommenders": "0.7.3",
              # the destination environments (pyproject.toml [tool.parity.environments])
              "tensorflow (tf221)": "2.21.0", "tf-keras": "2.21.0", "keras 3": "3.15.1",
              "tensorflow-recommenders (tf221)": "0.7.7"}

__all__ = [
    "CHECKED_ON", "feature_column_key", "is_feature_column_layer", "keras_layer_classes", "keras_loss_class", "keras_model_class",
    "keras_symbolic_tensor_class", "tf1_losses_module",
    # optimizers
    "recording_tf1_apply_gradients", "optimizer_attributes", "wrapped_optimizer",
    "optimizer_gradient_tap", "keras_optimizer_slots", "create_keras_optimizer_state",
    "tf1_step_determined_state",
    # embedding
    "tfrs_embedding_parts", "TF1_TPU_DUMMY_TABLE_PREFIX", "TFRS_TPU_HELPER",
    "is_tpu_embedding_helper", "tpu_embedding_slot_names", "tfrs_table_slots",
    # strategies
    "fresh_collective_keys", "multi_worker_cpu_replicas", "untuned_per_device_input",
    # pipeline
    "serialized_dataset_graph", "compiled_user_loss", "checkpoint_writes",
    # global_state
    "global_seed", "set_global_seed", "global_generator", "set_global_generator",
    "op_determinism", "set_op_determinism", "grappler_options", "set_grappler_options",
    "eager_by_default", "set_eager_by_default", "keras_global_policy",
]
