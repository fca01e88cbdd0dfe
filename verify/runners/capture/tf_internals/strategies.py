"""The private parts of `tf.distribute` strategies the suite touches: `MirroredStrategy`'s
collective key base (strategies of different sizes in one process) and the local devices of a
`MultiWorkerMirroredStrategy` worker (its replicas on logical CPUs)."""
from __future__ import annotations

import contextlib
from typing import Iterator


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
