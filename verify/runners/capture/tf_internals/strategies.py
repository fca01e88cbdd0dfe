"""The private parts of `tf.distribute` strategies the suite touches: `MirroredStrategy`'s
collective key base (fresh keys for every strategy a process builds), the local devices of a
`MultiWorkerMirroredStrategy` worker (its replicas on logical CPUs) and the per-device input
pipelines a distributed dataset builds (`untuned_per_device_input`)."""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator


# Group keys a strategy may take from its base: a MirroredStrategy takes one per device set it
# reduces over, so a range this wide is never exhausted; 2**31 / 10,000 ranges per process.
KEY_RANGE = 10_000
_ranges = itertools.count(1)


def fresh_collective_keys() -> int:
    """Number the collective groups of every strategy built from now on from keys no strategy
    in this process took before; return the first key.

    Every `MirroredStrategy` numbers its collective groups
    from `_collective_key_base + 1` and their instances from 100, and TensorFlow's collective
    executor keeps each (group, instance) it has seen, with its shape and group size, for the
    process's lifetime. A second strategy on the same keys inherits them: a model with other
    variable sizes fails ("Shape mismatch in the collective instance 100 ... expected shape
    [79] but another member in the group expected shape [39]"), another replica count too
    ("joining a group with size 8, but that group has size 2"), and the failed collective
    aborts every later one in the process. TensorFlow's own tests move the same class
    attribute (`strategy_combinations._mirrored_strategy_with_collective_key_base`).
    `MultiWorkerMirroredStrategy` keeps its keys: its workers must agree on them, and each of
    its runs starts fresh worker processes."""
    from tensorflow.python.distribute import mirrored_strategy as mirrored

    base = next(_ranges) * KEY_RANGE
    for strategy in (mirrored.MirroredStrategy, mirrored.MirroredStrategyV1):
        strategy._collective_key_base = base
    return base


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
def untuned_per_device_input() -> Iterator[None]:
    """Build the per-device pipelines of every distributed dataset iterated in the block
    without tf.data's autotuning: the same elements in the same order, without the autotuning
    thread each one starts.

    `strategy.experimental_distribute_dataset` feeds each replica through a pipeline of its
    own, a one-element prefetch of what the host iterator hands that device
    (`multi_device_iterator_ops._create_device_dataset`, the same in TF 2.15 and 2.21). Those
    pipelines take default options, whatever the user's dataset sets, so each starts an
    autotuning thread (`Model::OptimizeLoop`) at its first element. When the iterator is
    deleted (the end of every `for x in dist_dataset`), TensorFlow's `CancellationManager`
    runs the thread's wake-up callback before it marks itself cancelled; a thread that wakes
    in between sees "not cancelled" and sleeps out the rest of its optimization period (which
    doubles after each optimization, up to a minute), and the deletion waits for it. On an
    idle machine the thread rarely wins that race; on a busy one (two xdist workers on two
    cores) it often does: a run's epoch ends stall for seconds (measured: `benchmarks/
    input_teardown.py`). Autotuning only sizes buffers and parallelism; a prefetch of one
    element has neither to tune. The user's own dataset keeps its options, and a TensorFlow
    without this function is left as it is.

    >>> with untuned_per_device_input():  # doctest: +SKIP
    ...     trace = runner.run(request)
    """
    try:
        import tensorflow as tf
        from tensorflow.python.data.ops import multi_device_iterator_ops as per_device
        original = per_device._create_device_dataset
    except (ImportError, AttributeError):   # another TensorFlow, or none: nothing to change
        original = None
    if original is None:
        yield   # (outside the handler: an error in the block is not chained to this one)
        return

    def untuned(*args, **kwargs):
        options = tf.data.Options()
        options.autotune.enabled = False
        return original(*args, **kwargs).with_options(options)

    per_device._create_device_dataset = untuned
    try:
        yield
    finally:
        per_device._create_device_dataset = original
