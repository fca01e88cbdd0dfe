"""The private parts of TPU embedding the suite touches: a tfrs `TPUEmbedding` layer's
optimizer, feature configs, tables and slots; the helper variables TensorFlow adds for the
embedding engine's gradients; the names TPUEstimator gives a table's slots on a TPU."""
from __future__ import annotations

from typing import Any


def tfrs_embedding_parts(layer) -> tuple[Any, list, dict]:
    """A tfrs `TPUEmbedding` layer's optimizer (`_optimizer`), its flattened feature configs
    (`_feature_config`) and its tables `{TableConfig: variable}`
    (`_tpu_embedding.embedding_tables`; off a TPU the layer holds a
    `TPUEmbeddingForServing`, whose tables are ordinary variables)."""
    import tensorflow as tf

    return (layer._optimizer, tf.nest.flatten(layer._feature_config),
            dict(layer._tpu_embedding.embedding_tables))


# Variables TensorFlow adds to a model trained on a TPU, which no case maps: TPUEstimator's
# dummy table variables (`tpu_embedding_gradient.create_dummy_table_variables`, shape [1], the
# gradient trap of each table) and the tfrs `TPUEmbedding` layer's helper weight
# (`tpu_embedding_layer._DUMMY_NAME`, its custom-gradient trap under TPUStrategy).
TF1_TPU_DUMMY_TABLE_PREFIX = "tpu_embedding_dummy_table_variable_"
TFRS_TPU_HELPER = "tpu_embedding_helper_dummy"


def is_tpu_embedding_helper(native: str) -> bool:
    """Whether a variable is one TensorFlow adds for the TPU embedding engine's gradients
    (see `TF1_TPU_DUMMY_TABLE_PREFIX`, `TFRS_TPU_HELPER`), not a variable of the model.

    >>> is_tpu_embedding_helper("tpu_embedding_dummy_table_variable_t0")
    True
    >>> is_tpu_embedding_helper("model/tpu_embedding/tpu_embedding_helper_dummy")
    True
    >>> is_tpu_embedding_helper("dense/kernel")
    False
    """
    leaf = native.rsplit("/", 1)[-1]
    return leaf.startswith(TF1_TPU_DUMMY_TABLE_PREFIX) or leaf == TFRS_TPU_HELPER


# The TF1 optimizer slot name (`Optimizer.get_slot_names()`) of each field of the slot-name
# tuples TPUEstimator gives a table's slots on a TPU.
_TF1_SLOT_OF_ENGINE_FIELD = {
    "AdagradSlotVariableNames": {"accumulator": "accumulator"},
    "AdamSlotVariableNames": {"m": "m", "v": "v"},
    "FtrlSlotVariableNames": {"accumulator": "accum", "linear": "linear"},
}


def tpu_embedding_slot_names(table: str, optimization_parameters) -> dict[str, str]:
    """Checkpoint name -> TF1 slot name of an embedding table's slots when TPUEstimator trains
    it on a TPU: the names `_tpu_estimator_embedding._get_slot_variable_names` gives the host
    variables the engine's slots are retrieved into (`<table>/Adagrad`; Adam `<table>/Adam/m`,
    `/Adam/v`; FTRL `<table>/Ftrl`, `/Ftrl_1`), each with the slot name the model_fn's TF1
    optimizer gives the same slot on CPU (`accumulator`; `m`, `v`; `accum`, `linear`).
    {} for SGD (no slot)."""
    from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding

    scope, _, var = table.rpartition("/")
    names = _tpu_estimator_embedding._get_slot_variable_names(scope, var,
                                                              optimization_parameters)
    if names is None:
        return {}
    fields = _TF1_SLOT_OF_ENGINE_FIELD.get(type(names).__name__, {})
    return {name: fields.get(field, field) for field, name in names._asdict().items()}


# A tfrs TPUEmbedding table's slot as the engine's optimizer names it
# (`tpu_embedding_v2_utils.{Adagrad,Adam,FTRL}._slot_names`) -> as the Keras optimizer names
# the same slot (tfrs `tpu_embedding_layer._SLOT_NAME_MAPPING`), which the taps record.
_KERAS_SLOT_OF_ENGINE_SLOT = {"accumulators": "accumulator", "momenta": "m", "velocities": "v",
                              "linears": "linear"}


def tfrs_table_slots(layer) -> dict[str, Any]:
    """`table::slot` -> slot variable of every table of a tfrs `TPUEmbedding` layer built off a
    TPU, whichever optimizer made the slots: the Keras optimizer given to the layer (its
    `add_slot`) or a `tf.tpu.experimental.embedding` one (the mid-level API's own variables).
    Read from the mid-level object's `_variables` (table name -> {"parameters": table,
    slot: variable}), with the slots named as Keras names them (`accumulator`, `m`, `v`,
    `linear`)."""
    from verify.core.names import native_name

    out = {}
    for variables in layer._tpu_embedding._variables.values():
        table = native_name(variables["parameters"])
        for slot, variable in variables.items():
            if slot != "parameters":
                out[f"{table}::{_KERAS_SLOT_OF_ENGINE_SLOT.get(slot, slot)}"] = variable
    return out
