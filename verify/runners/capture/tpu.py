"""The only code that needs a TPU attached: where a run picks up the TPU.

Everything else the TPU path runs is ordinary code exercised on CPU: the TF1 `host_call`
capture, input tap and checkpoint reads (`verify.runners.capture.host_call`), the TF2 checkpoint
read-back of tables and slots (`verify.runners.keras.tpu`, `verify.runners.keras3.tpu`), and
the taps, which reach the host through `host_transfer` (a pass-through outside a TPU
computation). Tests replace the
functions below with CPU stand-ins and run the whole `--tpu` path; what stays unexercised is
listed in docs/how-to/tpu.md ("TPU: what runs where").
"""
from __future__ import annotations

from typing import Any


def tpu_strategy(tpu_name: str = "", replicas: int | None = None):
    """`TPUStrategy` on the TPU `tpu_name` names ('' = this TPU VM), on a freshly initialized
    TPU system; raises `verify.runners.capture.devices.TpuUnavailable` saying why when none answers.
    `replicas`: that many cores of the topology (`DeviceAssignment.build`), for a run that
    trains on fewer replicas than the TPU has cores; None: every core.

    Every run re-initializes the system: the TPU embedding engine takes one configuration per
    initialization (a second `TPUEmbedding` raises "TPU is already initialized for
    embeddings", `tpu_embedding_v2.TPUEmbedding.build`), and a TPUEstimator run before it shuts
    the system down when it ends (`TPUInfeedOutfeedSessionHook.end`)."""
    import tensorflow as tf

    from verify.runners.capture.devices import resolve_tpu

    resolver = resolve_tpu(tpu_name)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    if replicas is None:
        return tf.distribute.TPUStrategy(resolver)
    assignment = tf.tpu.experimental.DeviceAssignment.build(topology, num_replicas=replicas)
    return tf.distribute.TPUStrategy(resolver, experimental_device_assignment=assignment)


def jax_tpu_devices(replicas: int = 1) -> list:
    """The first `replicas` TPU devices JAX sees; raises `TpuUnavailable` saying why when JAX
    has none (no TPU attached, or the environment's jax lacks the TPU runtime `libtpu`)."""
    import jax

    from verify.runners.capture.devices import TpuUnavailable

    try:
        devices = jax.devices("tpu")
    except RuntimeError as e:   # "Unknown backend tpu" / "Backend 'tpu' failed to initialize"
        raise TpuUnavailable(
            f"--tpu was given but JAX reaches no TPU ({e}); it sees "
            f"{[d.platform for d in jax.devices()]}. Run on a TPU VM whose environment has "
            f"jax[tpu] (libtpu) and jax-tpu-embedding, or drop --tpu to run on CPU.") from e
    if len(devices) < replicas:
        raise TpuUnavailable(f"--tpu: JAX sees {len(devices)} TPU devices, the run needs "
                             f"{replicas}")
    return devices[:replicas]


def estimator_cluster(tpu_name: str = "") -> tuple[Any, bool]:
    """(cluster resolver, use_tpu) for `TPUEstimator`'s `RunConfig(cluster=...)` and
    `TPUEstimator(use_tpu=...)` on the TPU `tpu_name` names."""
    from verify.runners.capture.devices import resolve_tpu

    return resolve_tpu(tpu_name), True


def host_transfer(computation, *args):
    """Run `computation(*args)` on the host: `tf.tpu.outside_compilation` (exported in TF 2.15
    as `tf.compat.v1.tpu.outside_compilation`, the same function, which handles TF2
    functions), which inside a TPU computation moves the ops to the host CPU and anywhere else
    calls `computation` as it is.

    >>> host_transfer(lambda x: x + 1, 1)  # doctest: +SKIP
    2
    """
    import tensorflow as tf

    return tf.compat.v1.tpu.outside_compilation(computation, *args)
