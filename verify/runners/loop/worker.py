"""One worker of a multi-worker loop run: `python -m verify.runners.loop.worker JOB TASK`.

Started by `MultiWorkerLoopRunner` with `TF_CONFIG` in its environment. It splits the CPU
into its replicas' logical devices before TensorFlow starts, creates the
`MultiWorkerMirroredStrategy` (which connects to the other workers), runs `LoopRunner`'s
epochs of the user's loop under it with the taps installed, and writes into
`<run dir>/worker-<TASK>/`: `replicas.npz` (what its replicas consumed), the chief's
`trace.json`/`.npz`, and last `worker.json` (the checkpoint paths it wrote and its error, if
it raised). It exits 0 when the run did not raise, and ends itself when its parent dies.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from verify.core.files import write_atomic
from verify.core.trace import Trace
from verify.runners.loop.runner import LoopRunner
from verify.runners.loop.multi_worker import STOP_SIGNAL, WorkerJob
from verify.runners.loop.worker_outputs import ReplicaLog, output_dir
from verify.runners.loop.worker_startup import CONNECTED, extend_import_path
from verify.runners.run import describe_error
from verify.runners.capture.taps import StepTaps
from verify.runners.capture.tf_internals import (checkpoint_writes, keras_optimizer_slots,
                                         multi_worker_cpu_replicas, untuned_per_device_input)
from verify.runners.worker_group import exit_with_parent

# A worker that is not the chief sends no gradients, weights or slots to its trace (the
# chief's are the run's): gradients and variables every NEVER-th step.
NEVER = sys.maxsize
STARTED = time.monotonic()


def progress(text: str) -> None:
    """A line in the worker's log (its tail is what a failure report shows)."""
    print(f"[worker {time.monotonic() - STARTED:7.2f} s] {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class WorkerLoopRunner(LoopRunner):
    """`LoopRunner` as worker `worker` (TensorFlow's id in the cluster) of a
    `MultiWorkerMirroredStrategy` run: the strategy is the multi-worker one, and the taps
    watch this worker's `replicas_per_worker` replicas."""

    worker: int = 0
    replicas_per_worker: int = 1
    replica_log: Any = None
    connected: Any = None      # the file to create once the cluster has formed

    def _strategy(self, request):
        import tensorflow as tf

        progress("TensorFlow imported; connecting to the other workers")
        with multi_worker_cpu_replicas(self.replicas_per_worker):
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        progress(f"MultiWorkerMirroredStrategy: {strategy.num_replicas_in_sync} replicas, "
                 f"here {', '.join(strategy.extended.worker_devices)}")
        self.connected.touch()     # the runner's start-up watch waits for this
        local = len(strategy.extended.worker_devices)
        if local != self.replicas_per_worker or \
                strategy.num_replicas_in_sync != request.implementation.replicas:
            raise RuntimeError(
                f"{request.implementation.name} asks for {request.implementation.replicas} "
                f"replicas, {self.replicas_per_worker} per worker; this worker's "
                f"MultiWorkerMirroredStrategy has {local} local replicas "
                f"({', '.join(strategy.extended.worker_devices)}) and "
                f"{strategy.num_replicas_in_sync} in all")
        return strategy, False   # (not TPUStrategy)

    def _taps(self, trace: Trace, variables: dict[str, Any], strategy,
              layers=None, host_transfer=None) -> StepTaps:
        return StepTaps(trace, variables, self.replicas_per_worker,
                        lambda optimizer: keras_optimizer_slots(optimizer, variables),
                        variables_every=self.variables_every if self.worker == 0 else NEVER,
                        first_replica=self.worker * self.replicas_per_worker,
                        on_replicas=self.replica_log.add)


def configure_devices(replicas: int) -> None:
    """`replicas` logical CPUs, before the runtime starts (a worker with that many GPUs uses
    them instead)."""
    import tensorflow as tf

    if len(tf.config.list_physical_devices("GPU")) >= replicas:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)


def run_worker(job: WorkerJob, task: int) -> int:
    """Run `task`'s share of `job`; write its outputs; return the exit status."""
    out = output_dir(job.request.workdir, task)
    shutil.rmtree(out, ignore_errors=True)      # a previous run's files are not this run's
    out.mkdir(parents=True)
    log = ReplicaLog()
    checkpoints: list[dict] = []
    fields = {f.name: getattr(job.runner, f.name) for f in dataclasses.fields(LoopRunner)}
    fields["strategy"] = "mirrored"   # LoopRunner's check; _strategy makes the multi-worker one
    runner = WorkerLoopRunner(**fields, worker=task,
                              replicas_per_worker=job.replicas_per_worker, replica_log=log,
                              connected=out / CONNECTED)
    request = dataclasses.replace(job.request, trace=Trace(job.request.implementation.name))
    trace = request.trace
    error = None

    def wrote(prefix) -> None:
        prefix = prefix.numpy().decode() if hasattr(prefix, "numpy") else os.fspath(prefix)
        checkpoints.append({"path": os.path.abspath(prefix),
                            "after_step": max(trace.steps(), default=0)})

    progress(f"task {task} of {job.request.implementation.name} (pid {os.getpid()})")
    try:
        configure_devices(job.replicas_per_worker)
        with checkpoint_writes(wrote), untuned_per_device_input():
            runner.run(request)
        progress(f"trained {max(trace.steps(), default=0)} steps")
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the runner
        error = describe_error(e, max((int(k.split("/")[0]) for k in log.arrays), default=0) + 1)
        trace.error = error
        progress(f"raised {error.splitlines()[0]}")
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)    # what it has is written whole
    log.save(out / "replicas.npz")
    if task == 0:
        trace.save(out / "trace", compress=False)
    write_atomic(out / "worker.json", json.dumps(
        {"worker": task, "pid": os.getpid(), "checkpoints": checkpoints, "error": error},
        indent=1))
    progress("outputs written")
    return 0 if error is None else 1


class StoppedByRunner(BaseException):
    """The runner's stop signal: another worker failed or the run ran out of time."""


def _stopped(signum, frame):
    raise StoppedByRunner("stopped by the runner (another worker failed, or the run ran out "
                          "of time)")


def stop_on_signal() -> None:
    """Turn the runner's stop signal (`STOP_SIGNAL`) into `StoppedByRunner` in the main thread,
    so a worker that is not stuck inside one TensorFlow call still writes what it captured
    (one stuck there is killed after the runner's grace period). The runner does not use
    SIGTERM: a `MultiWorkerMirroredStrategy` worker keeps running on it (TensorFlow's
    preemption notifier catches it; seen on TF 2.15.1). The kernel may hand the signal to any of the
    process's threads, and Python then runs the handler only when the main thread next runs
    Python, which a main thread asleep in a system call does not: so a thread that hears of
    the signal (the wakeup fd) interrupts the main thread (SIGUSR1)."""
    import threading

    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    signal.signal(STOP_SIGNAL, _stopped)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    main_thread = threading.main_thread().ident

    def relay():
        while True:
            if STOP_SIGNAL in os.read(read, 64):
                signal.pthread_kill(main_thread, signal.SIGUSR1)

    threading.Thread(target=relay, name="stop-on-signal", daemon=True).start()


def main(argv: list[str]) -> int:
    stop_on_signal()
    exit_with_parent()
    if len(argv) != 2:
        print("usage: python -m verify.runners.loop.worker JOB.pkl TASK", file=sys.stderr)
        return 2
    extend_import_path()
    job = WorkerJob.load(Path(argv[0]))
    status = run_worker(job, int(argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    return status


if __name__ == "__main__":
    # os._exit: TensorFlow's collective runtime can block interpreter shutdown while a peer
    # is gone; everything this worker reports is written by now.
    os._exit(main(sys.argv[1:]))
