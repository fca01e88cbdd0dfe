"""The private parts of TF1 and Keras optimizers the suite touches: the TF1 base class's
`apply_gradients` (recorded while a graph builds), the Keras methods the gradient tap wraps,
where slots are found and created, hyperparameters kept as private attributes, wrapped inner
optimizers and TF1 Adam's beta powers."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


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
    variable is the longest path that starts it.

    Keras 2.11+ `SGD` keeps an `m` per variable even at momentum 0 (`SGD.build`), where each
    update overwrites it with that step's own update (`m.assign(-gradient * lr + m * 0)`): it
    carries nothing from one step to the next, and TF1's, legacy Keras' and Keras 3's SGD keep
    no such slot; it is not read as one (`unused_sgd_momentum`)."""
    from verify.core.names import native_name

    out = {}
    if unused_sgd_momentum(optimizer):
        return out
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


def unused_sgd_momentum(optimizer) -> bool:
    """A Keras 2.11+ `SGD` (not the legacy one, which has `get_slot_names`) at momentum 0:
    its only slots, `momentums`, hold each step's update and no state."""
    return (type(optimizer).__name__ == "SGD" and not hasattr(optimizer, "get_slot_names")
            and _number(getattr(optimizer, "momentum", None)) == 0.0)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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
