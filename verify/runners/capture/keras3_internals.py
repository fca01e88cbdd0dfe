"""Every place the suite touches a private Keras 3 or keras-rs detail, in one module.

The Keras 3 counterpart of `verify.runners.capture.tf_internals`. Checked on Keras 3.15.1, keras-rs
0.4.0, JAX 0.10.2 and TensorFlow 2.21.0. Each function says what it relies on; when an upgrade
breaks one, this is the only file to change. Importing this module imports neither Keras nor
a backend.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

CHECKED_ON = {"keras": "3.15.1", "keras-rs": "0.4.0", "jax": "0.10.2", "tensorflow": "2.21.0"}

# Optimizer variables that are not slots of a trainable variable.
OPTIMIZER_COUNTERS = ("iteration", "iterations", "learning_rate")


@contextlib.contextmanager
def optimizer_update_tap(optimizer, callback: Callable[[list, list], None]) -> Iterator[None]:
    """Call `callback(grads, variables)` with the gradients a Keras 3 optimizer applies: the
    arguments of `BaseOptimizer._backend_update_step(grads, trainable_variables,
    learning_rate)`, which every backend reaches after unscaling, gradient accumulation,
    `_clip_gradients` (clipnorm, global_clipnorm, clipvalue) and weight decay
    (`_backend_apply_gradients`; the JAX optimizer overrides that one and still calls it), just
    before the update rule. The wrapped method is called with the same arguments and its
    result returned unchanged; the instance is restored afterwards."""
    original = optimizer._backend_update_step

    def tapped(grads, trainable_variables, learning_rate):
        callback(list(grads), list(trainable_variables))
        return original(grads, trainable_variables, learning_rate)

    # object.__setattr__: the optimizer's own __setattr__ would track the function as state
    object.__setattr__(optimizer, "_backend_update_step", tapped)
    try:
        yield
    finally:
        optimizer.__dict__.pop("_backend_update_step", None)


def optimizer_slots(optimizer, variables: dict[str, Any]) -> dict[str, Any]:
    """`path::slot` -> slot variable of a Keras 3 optimizer. Keras 3 names a slot
    `<variable path with '/' as '_'>_<slot>` (`add_variable_from_reference`:
    `dense/kernel` -> `dense_kernel_momentum`); the owner is the longest variable whose mangled
    path starts the slot's name. The iteration counter and learning rate are not slots."""
    mangled = {path.replace("/", "_") + "_": path for path in variables}
    out = {}
    for slot in optimizer.variables:
        name = slot.name
        if name in OPTIMIZER_COUNTERS:
            continue
        owner = max((m for m in mangled if name.startswith(m)), key=len, default=None)
        if owner is not None:
            out[f"{mangled[owner]}::{name[len(owner):]}"] = slot
    return out


def all_layers(model) -> list:
    """Every layer of a model, nested ones included (`Layer._flatten_layers`)."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def is_distributed_embedding(layer) -> bool:
    """A keras-rs `DistributedEmbedding` (of any backend): it keeps its features by placement
    in `_placement_to_path_to_feature_config`."""
    return hasattr(layer, "_placement_to_path_to_feature_config")


def distributed_embedding_tables(layer) -> list[tuple[Any, Any, int]]:
    """`(TableConfig, variable or None, features using it)` for each table of a keras-rs
    `DistributedEmbedding`. Relies on `_placement_to_path_to_feature_config` (placement ->
    feature path -> FeatureConfig) and, for tables on the default device (every table off a
    SparseCore TPU), `_default_device_embedding_layers` (feature path -> the `EmbedReduce`
    layer that holds the table as `embeddings`); SparseCore tables have no variable here."""
    tables: dict[int, list] = {}
    layers = getattr(layer, "_default_device_embedding_layers", {})
    for placement, features in layer._placement_to_path_to_feature_config.items():
        for path, feature in features.items():
            entry = tables.setdefault(id(feature.table), [feature.table, None, 0])
            entry[2] += 1
            if placement == "default_device" and path in layers:
                entry[1] = layers[path].embeddings
    return [tuple(entry) for entry in tables.values()]


def table_placement(layer, table) -> str:
    """Where a keras-rs table lives in this process: "sparsecore" or "default_device" (the
    placement "auto" resolves to, read from `_placement_to_path_to_feature_config`)."""
    for placement, features in layer._placement_to_path_to_feature_config.items():
        if any(f.table is table for f in features.values()):
            return placement
    return "unknown"


def tpu_table_optimizer(optimizer) -> Any:
    """The TPU embedding optimizer keras-rs builds from a table's optimizer (a Keras optimizer
    or a name such as "adam") when the table is placed on a SparseCore: keras-rs'
    `tensorflow.config_conversion.to_tf_tpu_optimizer` (a `tf.tpu.experimental.embedding`
    optimizer; it raises ValueError for options the TPU engine does not support, such as an
    Adagrad epsilon other than 1e-7). The JAX backend converts with the same options to
    jax-tpu-embedding specs (`jax.config_conversion.keras_to_jte_optimizer`, not importable
    without jax-tpu-embedding). Imports TensorFlow."""
    from keras_rs.src.layers.embedding.tensorflow import config_conversion

    return config_conversion.to_tf_tpu_optimizer(optimizer)


def sync_jax_state(model) -> None:
    """Write a JAX-backend model's training state back into its variables (`jax_state_sync`;
    during `fit` the state lives outside the variables). A no-op on other backends."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def global_dtype_policy() -> Any:
    """Keras 3's global dtype policy as set (None: follow floatx): the global-state attribute
    `dtype_policy` that `keras.config.set_dtype_policy` writes
    (`keras.src.backend.common.global_state`)."""
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("dtype_policy", None)


def set_global_dtype_policy(policy: Any) -> None:
    """Set it back (the public setter refuses None, the fresh value)."""
    from keras.src.backend.common import global_state

    global_state.set_global_attribute("dtype_policy", policy)


# ---- tables in the TPU embedding engine (a keras-rs table placed on a SparseCore) ----

GRADIENT_TRAP = "_gradient_trap_dummy"   # keras-rs' zero weight its engine gradient hangs on
# The TPU embedding engine's slot names (`tf.tpu.experimental.embedding.*._slot_names`) as
# Keras 3 names the same optimizer's slots (`add_variable_from_reference`).
KERAS3_SLOT_OF_ENGINE_SLOT = {"accumulators": "accumulator", "momenta": "momentum",
                              "velocities": "velocity", "linears": "linear"}


def is_gradient_trap(variable) -> bool:
    """keras-rs' `_gradient_trap_dummy` weight (TensorFlow backend on a SparseCore TPU): a
    zero the engine's custom gradient hangs on, trained by nothing."""
    return variable.path.endswith(GRADIENT_TRAP)


def engine_tables(layer) -> list:
    """The `TableConfig`s of a keras-rs `DistributedEmbedding` placed on a SparseCore in this
    process (`_placement_to_path_to_feature_config["sparsecore"]`), each once."""
    tables = {}
    for feature in layer._placement_to_path_to_feature_config.get("sparsecore", {}).values():
        tables.setdefault(id(feature.table), feature.table)
    return list(tables.values())


def default_device_path(layer, table) -> str:
    """The path a table's variable has where keras-rs places it on the default device (every
    table off a SparseCore TPU): its `EmbedReduce` layer is named after the table
    (`_default_device_init`) and keeps the table as `embeddings`."""
    return f"{layer.path}/{table.name}/embeddings"


def tf_engine(layer) -> tuple[Any, Any]:
    """(mid-level TPU embedding object, its optimizer) of a keras-rs layer on the TensorFlow
    backend under `TPUStrategy`: the `_tpu_embedding` and `_tpu_optimizer` its
    `_sparsecore_init` made (a `TPUEmbedding` on SparseCore v1 chips, a `TPUEmbeddingV2` on
    v2)."""
    return layer._tpu_embedding, layer._tpu_optimizer


def is_stacked_engine(engine) -> bool:
    """A `TPUEmbeddingV2` (SparseCore v2): it stacks and shards tables, and its `__init__`
    rewrites its `TableConfig`s' vocabulary and dim in place to the padded layout."""
    import tensorflow as tf

    return isinstance(engine, tf.tpu.experimental.embedding.TPUEmbeddingV2)


def tf_engine_feature_configs(layer) -> Any:
    """Fresh `tf.tpu.experimental.embedding.FeatureConfig`s of a keras-rs layer's SparseCore
    tables, at their own (unpadded) shapes, for the CPU twin: converted again from its keras-rs
    configs (keras-rs' `keras_to_tf_tpu_configuration`, stacking off), or cloned from the TF
    configs it was given (keras-rs' `clone_tf_tpu_feature_configs`; not possible on
    `TPUEmbeddingV2`, which padded those in place)."""
    from keras_rs.src.layers.embedding.tensorflow import config_conversion

    if getattr(layer, "_using_keras_rs_configuration", True):
        sparsecore = layer._placement_to_path_to_feature_config["sparsecore"]
        return config_conversion.keras_to_tf_tpu_configuration(sparsecore, None, 1)[0]
    if is_stacked_engine(layer._tpu_embedding):
        raise NotImplementedError(
            "a keras-rs layer configured with tf.tpu.experimental.embedding.FeatureConfig on a "
            "SparseCore v2 chip: TPUEmbeddingV2 padded those configs in place, so the tables' "
            "own shapes cannot be read back; configure it with keras_rs.layers.FeatureConfig")
    return config_conversion.clone_tf_tpu_feature_configs(layer._tpu_feature_configs)


def tf_engine_twin(feature_configs, optimizer) -> Any:
    """The CPU counterpart of a TF mid-level TPU embedding object:
    `tf.tpu.experimental.embedding.TPUEmbeddingForServing` with the same feature configs and
    optimizer, which TensorFlow documents as restoring the checkpoints of both engines
    (unstacking a `TPUEmbeddingV2`'s stacked tables through the layouts it saves, their
    parameters only), and whose plain checkpoint a `TPUEmbeddingV2` restores through its
    checkpoint adapter (resharding onto the SparseCores). It refuses to be created under a
    `TPUStrategy`; `variables` lists table name -> {"parameters": table, engine slot: slot}."""
    import tensorflow as tf

    return tf.tpu.experimental.embedding.TPUEmbeddingForServing(feature_configs, optimizer)


def load_into_engine(engine) -> None:
    """After its host variables were restored from a checkpoint another object wrote, push
    them into a `TPUEmbedding` (v1) engine: `_load_variables`, which its own restore hook calls
    only for checkpoints of a `TPUEmbedding` (its registered saver). A `TPUEmbeddingV2`'s
    variables are the TPU's own: restoring assigned them."""
    if not is_stacked_engine(engine) and hasattr(engine, "_load_variables"):
        engine._load_variables()


def jax_engine_variables(layer) -> list:
    """The variables keras-rs' JAX layer keeps for its SparseCore tables: the stacked tables
    and their slots (`_table_and_slot_variables`) and its step counter (`_iterations`), all
    created by `add_weight` and so among the model's trainable variables; none is a variable
    of the user's model."""
    import keras

    found = keras.tree.flatten(getattr(layer, "_table_and_slot_variables", {}))
    counter = getattr(layer, "_iterations", None)
    return found + ([counter] if counter is not None else [])
