"""The one writer of traces: every capture path hands its host-side arrays to a `StepRecorder`.

Whatever saw the values (the TF2 and Keras 3 taps, the TF1 capture hook and `host_call`, the
checkpoint and boundary reads, the join of a multi-worker run's outputs, the renaming into
canonical names), only this module calls `Trace.record` and writes a trace's values; the
quantities are named by `verify.core.quantities`' table, never by a literal in a runner
(`tests/project/test_one_trace_writer.py` keeps both). Adding a quantity is a row in that table
and the taps that capture it, which hand their arrays here.

A step is assembled the same way on every path: a replicated step's loss is the float32 sum of
its replicas' losses in replica order, its input the replicas' batches joined in replica order
(each only once every replica sent its own), a metric and a loss are float32 scalars.

>>> from verify.core.trace import Trace
>>> recorder = StepRecorder(Trace("tf2"))
>>> recorder.replica_step(1, {1: np.float32(0.25), 0: np.float32(0.5)},
...                       {0: {"x": np.array([1.0])}, 1: {"x": np.array([2.0])}}, replicas=2)
>>> recorder.weights(1, {"dense/kernel": np.ones(2, np.float32)})
>>> recorder.metric(1, "eval/loss", 0.5)
>>> [(k.step, k.quantity, k.tensor) for k in recorder.trace.values]
[(1, 'loss', 'loss'), (1, 'input', 'x'), (1, 'weight', 'dense/kernel'), (1, 'metric', 'eval/loss')]
>>> recorder.trace.get(1, "loss", "loss")
array(0.75, dtype=float32)
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Union

import numpy as np

from verify.core.quantities import GRAD, INPUT, LOSS, METRIC, SLOT, WEIGHT
from verify.core.trace import Key, Trace, digest_batch
from verify.runners.capture.batches import global_batch

# The loss an evaluation returns: Keras' `evaluate(return_dict=True)` and an Estimator's
# `evaluate()` give it under this key; the trace keeps it as the metric `EVAL_LOSS`.
EVALUATE_LOSS_KEY = "loss"
EVAL_LOSS = "eval/loss"
# Values by name: a mapping, or (name, value) pairs that read each value as it is recorded (a
# run's tables one at a time, never all of them in memory at once).
Named = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


def variable_quantity(name: str) -> str:
    """The quantity of a variable's value by its native name: a slot (`var::slot`) or a
    weight.

    >>> variable_quantity("dense/kernel"), variable_quantity("dense/kernel::accumulator")
    ('weight', 'slot')
    """
    return SLOT if "::" in name else WEIGHT


class StepRecorder:
    """Writes the values of one run into `trace` (native names, as the runner sees them;
    `renamed` writes the canonical trace `verify.runners.run.canonicalize` builds)."""

    def __init__(self, trace: Trace):
        self.trace = trace

    def value(self, step: int, quantity: str, name: str, value: Any) -> None:
        """One value of `quantity` (a name of `verify.core.quantities`) at `step`."""
        self.trace.record(step, quantity, name, value)

    def values(self, step: int, quantity: str, values: Named) -> None:
        """Every value of `values` (`Named`, in its order) as `quantity` at `step`."""
        for name, value in _pairs(values):
            self.trace.record(step, quantity, name, value)

    def grads(self, step: int, grads: Named) -> None:
        """The gradients the optimizer applied at `step` (arrays, or `SparseRows`)."""
        self.values(step, GRAD, grads)

    def weights(self, step: int, weights: Named) -> None:
        """The variables after `step`'s update (step 0: as loaded); arrays or `TouchedRows`."""
        self.values(step, WEIGHT, weights)

    def slots(self, step: int, slots: Named) -> None:
        """The optimizer slots (`var::slot`) after `step`'s update."""
        self.values(step, SLOT, slots)

    def loss(self, step: int, loss: Any) -> None:
        """The loss `step` minimized, as a float32 scalar."""
        self.trace.record(step, LOSS, LOSS, np.float32(loss))

    def batch(self, step: int, batch: Mapping[str, Any]) -> None:
        """The batch `step` consumed (feature -> array or sparse parts), per example in
        canonical form (`verify.core.trace.digest_batch`)."""
        for name, digested in digest_batch(batch).items():
            self.trace.record(step, INPUT, name, digested)

    def replica_batches(self, step: int, batches: Mapping[int, Mapping[str, Any]],
                        replicas: int) -> None:
        """The replicas' batches joined in replica order, once all `replicas` sent theirs."""
        if len(batches) == replicas:
            self.batch(step, global_batch(batches))

    def replica_step(self, step: int, losses: Mapping[int, Any],
                     batches: Mapping[int, Mapping[str, Any]], replicas: int) -> None:
        """Step `step`'s loss (the float32 sum of the replicas' losses, in replica order) and
        its input (the replicas' batches joined in replica order), each only when all
        `replicas` replicas sent theirs."""
        if len(losses) == replicas:
            total = np.float32(0)
            for replica in sorted(losses):
                total = np.float32(total + np.float32(losses[replica]))
            self.loss(step, total)
        self.replica_batches(step, batches, replicas)

    def metric(self, step: int, name: str, value: Any) -> None:
        """A metric at `step` (an evaluation's loss, a loop's own metrics), as float32."""
        self.trace.record(step, METRIC, name, np.float32(value))

    def evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        """What an `evaluate()` returned (Keras' dict or an Estimator's): its loss, as the
        metric `eval/loss`."""
        self.metric(step, EVAL_LOSS, result[EVALUATE_LOSS_KEY])

    def not_captured(self, quantity: str, name: str, why: str) -> None:
        """Declare `quantity` of `name` never captured (the device does not let it be seen)."""
        self.trace.meta.not_captured.setdefault(quantity, {})[name] = why

    def read_every(self, quantity: str, name: str, every: int) -> None:
        """Declare `quantity` of `name` read only every `every` steps (and at the last)."""
        self.trace.meta.read_every.setdefault(quantity, {})[name] = every

    def taken_from(self, other: Trace, skip: tuple[str, ...] = ()) -> None:
        """Every value `other` recorded (another process's trace of this run), in its order,
        but those of the quantities in `skip`."""
        for key, value in other.values.items():
            if key.quantity not in skip:
                self.trace.record(key.step, key.quantity, key.tensor, value)

    def renamed(self, native: Trace, key: Key, new_key: Key, value: Any = None) -> None:
        """`native`'s value at `key` as this trace's `new_key`: shared without a copy, or
        `value` in its place when renaming transformed it."""
        if value is None:
            self.trace.values.share(native.values, key, new_key)
        else:
            self.trace.record(new_key.step, new_key.quantity, new_key.tensor, value)

    def drop_after(self, step: int) -> None:
        """Forget what was recorded after `step` (a run judged as if it had stopped there)."""
        for key in [k for k in self.trace.values if k.step > step]:
            del self.trace.values[key]


def _pairs(values: Named) -> Iterable[tuple[str, Any]]:
    return values.items() if isinstance(values, Mapping) else values
