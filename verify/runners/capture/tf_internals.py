"""Every place the suite touches a private TensorFlow, Keras or tfrs detail, in one module.

Checked on TensorFlow 2.15.1, Keras 2.15.0 and tensorflow-recommenders 0.7.3. Each function
says what it relies on; when a TF upgrade breaks one, this is the only file to change.
Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

CHECKED_ON = {"tensorflow": "2.15.1", "keras": "2.15.0", "tensorflow-recommenders": "0.7.3",
              # the destination environments (pyproject.toml [tool.parity.environments])
              "tensorflow (tf221)": "2.21.0", "tf-keras": "2.21.0", "keras 3": "3.15.1",
              "tensorflow-recommenders (tf221)": "0.7.7"}


@contextlib.contextmanager
def recording_tf1_apply_gradients(transform=None) -> Iterator[list[tuple[Any, tuple]]]:
    """Record every (optimizer, grads_and_vars) given to a `tf.compat.v1.train.Optimizer`
    while a graph builds. Relies on `tensorflow.python.training.optimizer.Optimizer`, the base
    class every TF1 optimizer (and `CrossShardOptimizer`, which passes the aggregated gradients
    on to its inner optimizer) applies gradients through. The call is passed on unchanged, or
    with its gradients transformed by `transform(grads_and_vars)` (a mutation)."""
    from tensorflow.python.training import optimizer as optimizer_lib

    original = optimizer_lib.Optimizer.apply_gradients
    calls: list[tuple[Any, tuple]] = []

    def recording(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = tuple(grads_and_vars)
        if transform is not None:
            grads_and_vars = tuple(transform(list(grads_and_vars)))
        calls.append((self, grads_and_vars))
        return original(self, grads_and_vars, global_step=global_step, name=name)

    optimizer_lib.Optimizer.apply_gradients = recording
    try:
        yield calls
    finally:
        optimizer_lib.Optimizer.apply_gradients = original


def serialized_dataset_graph(dataset) -> Any:
    """The serialized GraphDef of a `tf.data.Dataset` (`Dataset._as_serialized_graph`): a
    tensor in TF1 graph mode (run it in a session), an eager tensor in TF2 (`.numpy()`)."""
    return dataset._as_serialized_graph()


def compiled_user_loss(model) -> Any:
    """The loss given to `compile` (`model.compiled_loss._user_losses`, Keras 2.15): a string,
    a loss object or None."""
    return getattr(model.compiled_loss, "_user_losses", None)


def tfrs_embedding_parts(layer) -> tuple[Any, list, dict]:
    """A tfrs `TPUEmbedding` layer's optimizer (`_optimizer`), its flattened feature configs
    (`_feature_config`) and its tables `{TableConfig: variable}`
    (`_tpu_embedding.embedding_tables`; off a TPU the layer holds a
    `TPUEmbeddingForServing`, whose tables are ordinary variables)."""
    import tensorflow as tf

    return (layer._optimizer, tf.nest.flatten(layer._feature_config),
            dict(layer._tpu_embedding.embedding_tables))


@contextlib.contextmanager
def collective_key_range(replicas: int) -> Iterator[None]:
    """Let `MirroredStrategy`s of different sizes share a process: each replica count numbers
    its collective groups from its own key (`MirroredStrategy._collective_key_base`). Without
    it a 2-replica then an 8-replica strategy collide ("joining a group with size 8, but that
    group has size 2") and the failed collective poisons every later one."""
    import tensorflow as tf

    mirrored = tf.distribute.MirroredStrategy
    previous = mirrored._collective_key_base
    mirrored._collective_key_base = 1000 * replicas
    try:
        yield
    finally:
        mirrored._collective_key_base = previous


def optimizer_attributes(optimizer) -> dict[str, Any]:
    """An optimizer's hyperparameters as its object holds them: TF1 optimizers keep them only
    as private attributes (`_lr`, `_beta1`, `_initial_accumulator_value`, ...), Keras ones in
    `get_config()` too."""
    values = dict(vars(optimizer))
    if hasattr(optimizer, "get_config"):
        try:
            values.update(optimizer.get_config())
        except (TypeError, ValueError, NotImplementedError):
            pass
    return values


def wrapped_optimizer(optimizer) -> Any:
    """The optimizer a wrapper wraps: `CrossShardOptimizer` (`_opt`) or Keras'
    `LossScaleOptimizer` (`inner_optimizer`), else None."""
    return getattr(optimizer, "_opt", None) or getattr(optimizer, "inner_optimizer", None)


@contextlib.contextmanager
def optimizer_gradient_tap(optimizer, callback) -> Iterator[None]:
    """Call `callback(grads_and_vars)` with the gradients a Keras optimizer applies: after its
    cross-replica aggregation and its clipping, just before the update; the optimizer applies
    what the callback returns (the same pairs, unless a mutation transforms them). Legacy optimizers
    (`OptimizerV2`) apply the output of `_transform_gradients`; Keras 2.11+ optimizers the
    input of `_internal_apply_gradients` (after `_clip_gradients` and the deduplication of
    sparse gradients); Keras 3 on TensorFlow (3.15 checked) the input of
    `_distributed_tf_update_step` (after clipping, which Keras 3 does per replica, and the
    all-reduce). Where the gradients arrive in cross-replica context (Keras 3 under a
    strategy), `callback(pairs, replica=i)` sees each replica's copy and cannot transform them. The wrapped method is called with the same arguments and its result is
    returned unchanged; the instance is restored afterwards."""
    if hasattr(optimizer, "_transform_gradients"):       # keras.optimizers.legacy.*
        name = "_transform_gradients"
        original = optimizer._transform_gradients

        def tapped(grads_and_vars):
            return callback(list(original(grads_and_vars)))
    elif hasattr(optimizer, "_internal_apply_gradients"):   # keras.optimizers.* (2.11+)
        name = "_internal_apply_gradients"
        original = optimizer._internal_apply_gradients

        def tapped(grads_and_vars):
            return original(callback(list(grads_and_vars)))
    elif hasattr(optimizer, "_distributed_tf_update_step"):   # Keras 3, TensorFlow backend
        # `apply` clips, then `_backend_update_step` all-reduces and passes the summed
        # gradients with each Keras variable's TF variable (`.value`) to this method.
        name = "_distributed_tf_update_step"
        original = optimizer._distributed_tf_update_step

        def tapped(distribution, grads_and_vars, learning_rate):
            import tensorflow as tf

            keras_variable = {id(v.value): v for v in optimizer._trainable_variables}
            pairs = [(g, keras_variable.get(id(v), v)) for g, v in grads_and_vars]
            if not tf.distribute.in_cross_replica_context():
                applied = callback(pairs)
                return original(distribution, [(g, getattr(v, "value", v)) for g, v in applied],
                                learning_rate)
            # Under a strategy the summed gradients arrive once, one copy per replica: each
            # replica's copy is what that replica applies.
            for replica in range(distribution.num_replicas_in_sync):
                local = [(None if g is None else distribution.experimental_local_results(g)[replica],
                          v) for g, v in pairs]
                callback(local, replica=replica)
            return original(distribution, grads_and_vars, learning_rate)
    else:
        raise TypeError(f"{type(optimizer).__name__} is not a Keras optimizer the suite can "
                        f"observe (no _transform_gradients, _internal_apply_gradients or "
                        f"_distributed_tf_update_step)")
    setattr(optimizer, name, tapped)
    try:
        yield
    finally:
        optimizer.__dict__.pop(name, None)


def keras_optimizer_slots(optimizer, variables: dict[str, Any]) -> dict[str, Any]:
    """`var::slot` -> slot variable, for legacy Keras optimizers (`get_slot_names`/`get_slot`)
    and Keras 2.11+ ones, whose slots are named `<scope>/<slot>/<variable name>`
    (`m/conv2d/kernel`, `Adam/m/dense/kernel`, or `while/Adam/m/...` when created inside a
    loop): the variable is the longest name that ends the slot's name. Keras 3 (3.15 checked)
    names a slot `<variable path, / as _>_<kind>` (`sequential_dense_kernel_momentum`): the
    variable is the longest path that starts it."""
    from verify.core.names import native_name

    out = {}
    if hasattr(optimizer, "get_slot_names"):
        for name, var in variables.items():
            for slot in optimizer.get_slot_names():
                try:
                    out[f"{name}::{slot}"] = optimizer.get_slot(var, slot)
                except KeyError:
                    pass
        return out
    for slot in optimizer.variables:
        if isinstance(getattr(slot, "path", None), str):   # Keras 3
            # `add_variable_from_reference` names a slot `<variable path with _>_<kind>`
            name = slot.name
            owner = max((n for n in variables if name.startswith(n.replace("/", "_") + "_")),
                        key=len, default=None)
            if owner is not None:
                out[f"{owner}::{name[len(owner) + 1:]}"] = slot
            continue
        name = native_name(slot)
        owner = max((n for n in variables if name.endswith("/" + n)), key=len, default=None)
        if owner is not None:
            kind = name[:-len(owner) - 1].rsplit("/", 1)[-1]
            out[f"{owner}::{kind}"] = slot
    return out


def create_keras_optimizer_state(optimizer, variables: list) -> None:
    """Create everything a Keras optimizer keeps for `variables` before its first step: its
    step counter, hyperparameter variables and slots, as its first `apply_gradients` would.
    Legacy optimizers (`OptimizerV2`) do it in `_create_all_weights`, under the optimizer's
    name scope and `tf.init_scope` (the slot variables get the names they get in training);
    Keras 2.11+ ones in `build`."""
    import tensorflow as tf

    if hasattr(optimizer, "_create_all_weights"):
        with tf.name_scope(optimizer._name), tf.init_scope():
            optimizer._create_all_weights(variables)
    elif hasattr(optimizer, "build"):
        optimizer.build(variables)
    else:
        raise TypeError(f"{type(optimizer).__name__} is not a Keras optimizer the suite can "
                        f"create slots for (no _create_all_weights or build)")


def tf1_step_determined_state(optimizer) -> dict[str, float]:
    """A TF1 optimizer's non-slot variables that its step count determines, by variable name,
    each with the base it is raised to: `AdamOptimizer` keeps `beta1_power` and `beta2_power`
    (`_get_beta_accumulators()`, created in the graph by its first `apply_gradients`), which
    equal beta**(step + 1) after `step` updates; Keras' Adam computes them from `iterations`.
    Other optimizers: {}."""
    from verify.core.names import native_name

    if not hasattr(optimizer, "_get_beta_accumulators"):
        return {}
    beta1_power, beta2_power = optimizer._get_beta_accumulators()
    return {native_name(beta1_power): float(optimizer._beta1),
            native_name(beta2_power): float(optimizer._beta2)}


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


@contextlib.contextmanager
def multi_worker_cpu_replicas(count: int) -> Iterator[None]:
    """Let a `MultiWorkerMirroredStrategy` created in the block run `count` replicas on each
    worker's logical CPUs. On a worker without GPUs, TF 2.15 gives each worker one replica on
    `CPU:0` whatever devices exist (`CollectiveAllReduceExtended._initialize_local_devices`);
    this returns `CPU:0` to `CPU:{count-1}` in its place. Workers with GPUs (or TPUs) keep
    TF's choice. The logical CPUs must exist already (`tf.config.set_logical_device_configuration`
    before the runtime starts)."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = collective.CollectiveAllReduceExtended
    original = extended._initialize_local_devices

    def local_devices(self, cluster_resolver, worker_device):
        devices, kind = original(self, cluster_resolver, worker_device)
        if kind == "CPU" and count > 1:
            devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(count))
        return devices, kind

    extended._initialize_local_devices = local_devices
    try:
        yield
    finally:
        extended._initialize_local_devices = original


@contextlib.contextmanager
def checkpoint_writes(callback) -> Iterator[None]:
    """Call `callback(file_prefix)` before every TF2 checkpoint write in the block:
    `tf.train.Checkpoint.save`, `.write` and `tf.train.CheckpointManager.save` all write through
    `Checkpoint._write(file_prefix, ...)` (TF 2.15; `save` passes the numbered prefix,
    `ckpt-1`). The write itself is the original, called with the same arguments."""
    from tensorflow.python.checkpoint import checkpoint as checkpoint_lib

    original = checkpoint_lib.Checkpoint._write

    def write(self, file_prefix, *args, **kwargs):
        callback(file_prefix)
        return original(self, file_prefix, *args, **kwargs)

    checkpoint_lib.Checkpoint._write = write
    try:
        yield
    finally:
        checkpoint_lib.Checkpoint._write = original


# Process-wide state a user's code may change (verify.runners.capture.process_state). Each pair reads
# and sets one switch that TensorFlow or legacy Keras keep without a public getter.

def global_seed() -> tuple[Any, Any]:
    """The eager global seed and the position of the generator of op seeds derived from it
    (`context.context()._seed`, `._rng`): `tf.random.set_seed` resets both."""
    from tensorflow.python.eager import context

    ctx = context.context()
    rng = getattr(ctx, "_rng", None)
    return ctx._seed, (rng.getstate() if rng is not None else None)


def set_global_seed(value: tuple[Any, Any]) -> None:
    import tensorflow as tf
    from tensorflow.python.eager import context

    seed, position = value
    tf.random.set_seed(seed)   # also clears the kernel cache of seeded random ops
    ctx = context.context()
    if position is None:
        ctx._rng = None        # as a fresh context has it
    elif getattr(ctx, "_rng", None) is not None:
        ctx._rng.setstate(position)


def global_generator() -> Any:
    """The global `tf.random.Generator` (`stateful_random_ops.global_generator`; None until
    `tf.random.get_global_generator()` first creates it)."""
    from tensorflow.python.ops import stateful_random_ops

    return stateful_random_ops.global_generator


def set_global_generator(generator: Any) -> None:
    from tensorflow.python.ops import stateful_random_ops

    stateful_random_ops.global_generator = generator   # the public setter refuses None


def op_determinism() -> bool:
    """`tf.config.experimental.enable_op_determinism()`'s switch (`config` has no public
    `disable_op_determinism` export)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def set_op_determinism(enabled: bool) -> None:
    from tensorflow.python.framework import config

    (config.enable_op_determinism if enabled else config.disable_op_determinism)()


def grappler_options() -> dict[str, Any]:
    """The grappler options set by `tf.config.optimizer.set_experimental_options`
    (`context.context()._optimizer_experimental_options`; the public getter adds defaults, so
    an option once set could not be unset through it)."""
    from tensorflow.python.eager import context

    return dict(context.context()._optimizer_experimental_options)


def set_grappler_options(options: dict[str, Any]) -> None:
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx._optimizer_experimental_options = dict(options)
    ctx._thread_local_data.function_call_options = None   # rebuilt from the options


def eager_by_default() -> bool:
    """Whether TensorFlow executes eagerly by default (`context.default_execution_mode`), which
    `tf.compat.v1.disable_eager_execution()` switches off for the whole process."""
    from tensorflow.python.eager import context

    return context.default_execution_mode == context.EAGER_MODE


def set_eager_by_default(eager: bool) -> None:
    from tensorflow.python.eager import context

    context.default_execution_mode = context.EAGER_MODE if eager else context.GRAPH_MODE
    ctx = context.context_safe()
    if ctx is not None:
        ctx._thread_local_data.is_eager = eager


def keras_global_policy(keras) -> Any:
    """Legacy Keras' global mixed-precision policy as set (None: follow floatx), which
    `clear_session()` keeps (`keras.src.mixed_precision.policy._global_policy`, or
    `tf_keras.src...` in the TF 2.21 environment)."""
    module = sys.modules.get(f"{keras.__name__.split('.')[0]}.src.mixed_precision.policy")
    if module is None:   # never imported: nobody set a policy
        return None
    return module._global_policy
