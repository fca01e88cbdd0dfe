"""Every place the suite touches a private TensorFlow, Keras or tfrs detail, in one module.

Checked on TensorFlow 2.15.1, Keras 2.15.0 and tensorflow-recommenders 0.7.3. Each function
says what it relies on; when a TF upgrade breaks one, this is the only file to change.
Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

CHECKED_ON = {"tensorflow": "2.15.1", "keras": "2.15.0", "tensorflow-recommenders": "0.7.3"}


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
    sparse gradients). The wrapped method is called with the same arguments and its result is
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
    else:
        raise TypeError(f"{type(optimizer).__name__} is not a Keras optimizer the suite can "
                        f"observe (no _transform_gradients or _internal_apply_gradients)")
    setattr(optimizer, name, tapped)
    try:
        yield
    finally:
        optimizer.__dict__.pop(name, None)


def keras_optimizer_slots(optimizer, variables: dict[str, Any]) -> dict[str, Any]:
    """`var::slot` -> slot variable, for legacy Keras optimizers (`get_slot_names`/`get_slot`)
    and Keras 2.11+ ones, whose slots are named `<scope>/<slot>/<variable name>`
    (`m/conv2d/kernel`, `Adam/m/dense/kernel`, or `while/Adam/m/...` when created inside a
    loop): the variable is the longest name that ends the slot's name."""
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
        name = native_name(slot)
        owner = max((n for n in variables if name.endswith("/" + n)), key=len, default=None)
        if owner is not None:
            kind = name[:-len(owner) - 1].rsplit("/", 1)[-1]
            out[f"{owner}::{kind}"] = slot
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
