"""The taps on what each replica consumes (see `verify.runners.capture.taps`): its batch (the
arguments `strategy.run` hands its function) and its loss (the target of its
`tf.GradientTape.gradient` call). Each is a pass-through wrapper: it sends a copy of the values
to the host through `StepTaps` and calls the original with the same arguments."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from verify.core.quantities import LOSS
from verify.runners.capture.batches import flatten_batch

if TYPE_CHECKING:
    from verify.runners.capture.taps import StepTaps


def strategy_run_tap(taps: "StepTaps", original_run: Callable) -> Callable:
    """`strategy.run` that sends each replica's batch to the host, then runs the original."""
    import tensorflow as tf

    # the taps' own code is called as it is, never converted by autograph (which would
    # parse and rewrite it at every trace); the step's code keeps its conversion
    unconverted = tf.autograph.experimental.do_not_convert
    send_batch = unconverted(lambda a: taps._emit(
        taps._on_batch_arrays, flatten_batch(a[0] if len(a) == 1 else a)))

    def run(fn, args=(), kwargs=None, options=None):
        def replica_fn(*a, **k):
            send_batch(a)
            return fn(*a, **k)
        return original_run(replica_fn, args=args, kwargs=kwargs, options=options)

    return run


def gradient_tap(taps: "StepTaps", original_gradient: Callable) -> Callable:
    """`tf.GradientTape.gradient` that sends a scalar floating target (the loss) to the host,
    then differentiates it with the original."""
    import tensorflow as tf

    def gradient(tape, target, sources, *rest, **kw):
        if isinstance(target, tf.Tensor) and target.shape.rank == 0 and \
                target.dtype.is_floating:
            taps._emit(taps._on_loss_arrays, {LOSS: tf.cast(target, tf.float32)})
        return original_gradient(tape, target, sources, *rest, **kw)

    return gradient
