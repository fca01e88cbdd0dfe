"""Devices and strategies: logical CPU replicas, real GPUs when present, and TPU resolution.

TensorFlow fixes its device list when the runtime first initializes, so the logical CPU
devices are configured once per process, for the largest replica count the session needs.
"""
from __future__ import annotations

import os

from verify.runners.capture.tf_internals import fresh_collective_keys

MAX_CPU_REPLICAS = int(os.environ.get("PARITY_MAX_CPU_REPLICAS", "8"))
_configured: int | None = None


class TpuUnavailable(RuntimeError):
    """`--tpu` was asked for and no TPU could be reached."""


def configure_cpu_replicas(count: int = MAX_CPU_REPLICAS) -> int:
    """Split the host CPU into `count` logical devices before TensorFlow's runtime starts.

    Returns the number of logical CPUs available. Safe to call again; raises a clear error when
    the runtime already started with fewer devices than asked.

    >>> configure_cpu_replicas(8)  # doctest: +SKIP
    8
    """
    global _configured
    import tensorflow as tf

    if _configured is not None and _configured >= count:
        return _configured
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        _configured = count
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing < count:
            raise RuntimeError(
                f"TensorFlow's runtime started before the suite could create {count} logical CPU "
                f"devices (it has {existing}). Run the suite in a fresh process, or set "
                f"PARITY_MAX_CPU_REPLICAS={existing}.") from None
        _configured = existing
    return _configured


def replica_devices(replicas: int) -> list[str]:
    """The devices a `MirroredStrategy` of `replicas` replicas runs on: GPUs if there are enough,
    else logical CPUs."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= replicas:
        return [d.name for d in gpus[:replicas]]
    configure_cpu_replicas(max(replicas, MAX_CPU_REPLICAS))
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < replicas:
        raise RuntimeError(f"{replicas} replicas asked for, only {len(cpus)} logical CPUs exist")
    return [d.name for d in cpus[:replicas]]


CROSS_DEVICE_OPS = ("default", "reduction_to_one_device")


def mirrored_strategy(replicas: int, cross_device_ops: str = "default"):
    """`MirroredStrategy` over `replicas` devices.

    `cross_device_ops="reduction_to_one_device"` sums on one device instead of TF's default
    collectives. Measured with TF 2.15.1 on logical CPUs: the default collectives fail to gather
    sparse (IndexedSlices) gradients of different lengths per replica inside a multi-step
    `tf.function` (Keras `steps_per_execution > 1`: "CollectiveGatherV2 ... Shape mismatch"),
    and after that failure every collective in the process fails.

    Strategies of different replica counts and models coexist in one process: each strategy
    numbers its collectives from keys no earlier one took (`fresh_collective_keys`; measured:
    without it a 2-replica then an 8-replica strategy fail, and so does a 2-replica run of
    another model after a 2-replica run).
    """
    import tensorflow as tf

    if cross_device_ops not in CROSS_DEVICE_OPS:
        raise ValueError(f"cross_device_ops must be one of {CROSS_DEVICE_OPS}, "
                         f"got {cross_device_ops!r}")
    ops = tf.distribute.ReductionToOneDevice() if cross_device_ops != "default" else None
    fresh_collective_keys()
    return tf.distribute.MirroredStrategy(devices=replica_devices(replicas),
                                          cross_device_ops=ops)


def strategy_for(kind: str, replicas: int, implementation: str,
                 cross_device_ops: str = "default"):
    """The strategy a CPU/GPU runner asked for: "default" (one replica) or "mirrored".

    >>> strategy_for("mirrored", 2, "tf2-mirrored").num_replicas_in_sync  # doctest: +SKIP
    2
    """
    import tensorflow as tf

    if kind == "mirrored":
        return mirrored_strategy(replicas, cross_device_ops)
    if kind != "default":
        raise ValueError(f"{implementation}: strategy must be 'default' or 'mirrored', "
                         f"got {kind!r}")
    if replicas != 1:
        raise ValueError(f"{implementation}: replicas={replicas} needs strategy='mirrored'")
    configure_cpu_replicas()
    return tf.distribute.get_strategy()


_tpu_resolver = None


def resolve_tpu(tpu: str = ""):
    """Connect to the TPU named `tpu` ('' = the local TPU VM) once per process; return the
    cluster resolver. Raises `TpuUnavailable` saying why when no TPU answers."""
    global _tpu_resolver
    if _tpu_resolver is not None:
        return _tpu_resolver
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # the resolver raises ValueError, NotFoundError, ... depending on why
        raise TpuUnavailable(
            f"--tpu was given but no TPU is reachable (TPUClusterResolver(tpu={tpu!r}) failed: "
            f"{type(e).__name__}: {e}). Run on a TPU VM, pass --tpu-name NAME for a remote TPU, "
            f"or drop --tpu to run on CPU.") from e
    if not tf.config.list_logical_devices("TPU"):
        raise TpuUnavailable("--tpu was given; the TPU system initialized but lists no TPU "
                             "devices. Check the TPU runtime version against TF 2.15.1.")
    _tpu_resolver = resolver
    return resolver


def probe_tpu_in_child(tpu: str = "", timeout: float = 600.0) -> str | None:
    """Resolve the TPU `tpu` names in a child process that then exits; None when it answers,
    else why not (`TpuUnavailable`'s message). On a TPU VM one process at a time may hold the
    TPU (libtpu's lock): a session whose environment processes (sides run in other
    environments) need it probes here without taking it from them.

    >>> probe_tpu_in_child("no-such-tpu")  # doctest: +SKIP
    "--tpu was given but no TPU is reachable (TPUClusterResolver(tpu='no-such-tpu') failed: ..."
    """
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom verify.runners.capture.devices import TpuUnavailable, resolve_tpu\n"
            "try:\n    resolve_tpu(sys.argv[1])\nexcept TpuUnavailable as e:\n"
            "    print('TPU-UNAVAILABLE', str(e).replace('\\n', ' '))\n    sys.exit(3)\n")
    suite = str(Path(__file__).resolve().parents[3])   # where the verify package is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [suite, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run([sys.executable, "-c", code, tpu], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"--tpu: resolving the TPU did not answer within {timeout:g} s"
    if done.returncode == 0:
        return None
    said = [line for line in done.stdout.splitlines() if line.startswith("TPU-UNAVAILABLE ")]
    if done.returncode == 3 and said:
        return said[-1][len("TPU-UNAVAILABLE "):]
    tail = "\n".join(done.stderr.strip().splitlines()[-5:])
    return f"--tpu: the process resolving the TPU failed (exit code {done.returncode}): {tail}"
