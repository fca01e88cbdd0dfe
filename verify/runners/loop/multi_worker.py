"""A custom training loop under `tf.distribute.MultiWorkerMirroredStrategy`, one process per
worker, run as its user wrote it and captured by the same taps as `LoopRunner`.

On one machine the runner makes the cluster itself: it picks free loopback ports, writes each
worker's `TF_CONFIG`, and starts one process per worker (`python -m
verify.runners.loop.worker`), each splitting the CPU into the logical devices of its replicas
before TensorFlow starts. On real hosts a cluster manager sets `TF_CONFIG` on every host, and
the runner on each host starts only that host's worker with it (see `Cluster`); the workers'
files then meet in `PARITY_SHARED_DIR`, a directory every host mounts at the same path.

Each worker builds the user's loop with `build_loop(strategy, context)` under its
`MultiWorkerMirroredStrategy` and runs `LoopRunner`'s epochs with the taps installed. A worker
sees only its own replicas, so each writes what its replicas consumed (their batches and the
losses they differentiated, by replica number in sync) and the chief also writes its trace:
the gradients the optimizer applied after the all-reduce over every worker, the variables and
slots after the update, and the epochs' metrics. The runner joins them: step k's loss is the
float32 sum of every replica's loss in replica order and its input digest covers every
replica's batch in replica order, as `StepTaps` records them for replicas in one process.

Every worker also reports each checkpoint it wrote (`tf.train.Checkpoint.save`/`write`,
`CheckpointManager.save`): two workers writing the same path race on a shared filesystem (the
MultiWorkerMirroredStrategy guides have only the chief write the real path, the others a
temporary one), so the run fails there, after the last step before that save.

Workers that fail or hang are stopped and reported with their logs (`WorkerGroup`); no worker
outlives its run.

>>> MultiWorkerLoopRunner(build_loop=MyLoop, workers=2)  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from verify.core.trace import Trace
from verify.runners.loop.cluster import Cluster, ClusterConfigError, accepting, port_in_use
from verify.runners.loop.runner import LoopRunner
from verify.core.runner import RunRequest
from verify.runners.capture.taps import record_loss_and_input
from verify.runners.worker_group import WorkerGroup, WorkersFailed

SHARED_DIR = "PARITY_SHARED_DIR"   # on real hosts: where every worker's files meet
WORKER_MODULE = "verify.runners.loop.worker"
CONNECTED = "connected"    # a worker's file once its cluster formed (`output_dir`)
IMPORT_PATH = "PARITY_IMPORT_PATH"   # the runner's sys.path, appended to a worker's
# How the runner asks a worker to stop (then SIGKILL after the grace period): not SIGTERM, on
# which a MultiWorkerMirroredStrategy worker keeps running (TensorFlow's preemption notifier
# catches it; seen on TF 2.15.1).
STOP_SIGNAL = signal.SIGUSR2
PORT_ATTEMPTS = 3    # a loopback port taken between choosing it and the worker binding it
# What a worker's log says when its port was taken (gRPC's own words).
PORT_TAKEN = ("Could not start gRPC server", "Address already in use",
              "Failed to add port to server")


@dataclasses.dataclass(frozen=True)
class MultiWorkerLoopRunner(LoopRunner):
    """The user's loop under `MultiWorkerMirroredStrategy` over `workers` worker processes.

    The implementation's `replicas` is the total (all workers); each worker runs `replicas //
    workers` of them on its logical CPUs (or on its GPUs, when it has that many). `build_loop`
    travels to the workers by pickle: a module-level function or class, or a
    `functools.partial` of one. `timeout` bounds the workers' run in seconds (the session's
    `--run-timeout` applies as well); `grace` is how long a stopped worker gets between
    the stop signal and SIGKILL; `startup_timeout` is how long a worker waits for the others
    to connect before it fails, naming those that never accepted a connection.

    >>> MultiWorkerLoopRunner(build_loop=functools.partial(MyLoop, variant=v), workers=2,
    ...                       epochs=1)  # doctest: +SKIP
    """

    strategy: str = "multi_worker"
    workers: int = 2
    timeout: float | None = 1800.0
    grace: float = 3.0
    startup_timeout: float = 300.0

    def __post_init__(self):
        if self.strategy != "multi_worker":
            raise ValueError(f"MultiWorkerLoopRunner.strategy is 'multi_worker', got "
                             f"{self.strategy!r}")
        if self.workers < 1:
            raise ValueError(f"MultiWorkerLoopRunner.workers must be >= 1, got {self.workers}")
        if self.epochs < 1:
            raise ValueError(f"MultiWorkerLoopRunner.epochs must be >= 1, got {self.epochs}")
        if not self.startup_timeout > 0:
            raise ValueError(f"MultiWorkerLoopRunner.startup_timeout must be > 0 seconds, got "
                             f"{self.startup_timeout}")
        if self.after_training is not None or self.global_batch_replicas is not None:
            raise ValueError("MultiWorkerLoopRunner takes neither after_training nor "
                             "global_batch_replicas: the workers run the loop as written, with "
                             "the global batch of all their replicas")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        cluster = os.environ.get("TF_CONFIG", "").strip()
        out.update({"api": "custom training loop (the user's own step under strategy.run), one "
                           "process per worker",
                    "strategy": "MultiWorkerMirroredStrategy", "workers": self.workers,
                    "cluster": "TF_CONFIG given by the environment" if cluster
                               else "loopback, made by the runner"})
        return out

    def replicas_per_worker(self, replicas: int) -> int:
        """Replicas each worker runs for `replicas` in all; an error when they do not split."""
        if replicas < self.workers or replicas % self.workers:
            raise ValueError(f"{replicas} replicas do not split evenly over {self.workers} "
                             f"workers: give the implementation replicas = workers x replicas "
                             f"per worker")
        return replicas // self.workers

    def run(self, request: RunRequest) -> Trace:
        implementation = request.implementation
        per_worker = self.replicas_per_worker(implementation.replicas)
        cluster = Cluster.from_environment()
        if cluster is None:
            run_dir = request.workdir / f"{implementation.name}.workers"
            tasks = list(range(self.workers))
        else:
            if cluster.workers != self.workers:
                raise ClusterConfigError(
                    f"TF_CONFIG lists {cluster.workers} workers; {implementation.name} trains "
                    f"on {self.workers}. Run it on a cluster of {self.workers} workers, or "
                    f"unset TF_CONFIG to run it on this machine's loopback")
            run_dir = _shared_dir(request)
            tasks = [cluster.task]
            own = cluster.addresses[cluster.task]
            if port_in_use(own):
                raise ClusterConfigError(
                    f"TF_CONFIG gives this host's worker (task {cluster.task}) the address "
                    f"{own}, and another process already listens on that port: stop it, or "
                    f"give this task a free port in every host's TF_CONFIG")
        job = WorkerJob(request=_for_workers(request, run_dir), runner=self,
                        replicas_per_worker=per_worker, workers=self.workers)
        pickled = job.pickled()     # before anything is started or written
        # filled as the workers start, so a run stopped midway still says whom it started
        request.trace.meta.details["worker_pids"] = job.pids
        started = time.monotonic()
        failure = None
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._run_workers(job, pickled, run_dir, tasks, cluster)
                    failure = None
                    break
                except WorkersFailed as e:
                    failure = e
                    if cluster is not None or not _port_taken(run_dir, e.failed) \
                            or attempt == PORT_ATTEMPTS:
                        break
        except BaseException:   # a time limit, ^C: the steps the stopped chief wrote count
            join_outputs(request.trace, collect_outputs(run_dir, self.workers),
                         implementation.replicas, capture_steps=request.capture_steps)
            raise
        # On real hosts the other workers' files arrive from their hosts; wait for them only
        # when this host's worker finished.
        wait = None if cluster is None or failure else _remaining(self.timeout, started)
        outputs = collect_outputs(run_dir, self.workers, wait=wait)
        trace = join_outputs(request.trace, outputs, implementation.replicas,
                             capture_steps=request.capture_steps)
        trace.meta.details.update({"workers": self.workers, "replicas_per_worker": per_worker,
                                   "cluster": "loopback" if cluster is None else "TF_CONFIG"})
        # Workers that write one checkpoint path can fail in the race (a save deleting the
        # files another is merging): the shared path is then the cause to report.
        shared = shared_checkpoints(outputs, relative_to=run_dir)
        if shared:
            cut_after(trace, shared[0].after_step)
        if failure is not None:
            message = _with_worker_errors(failure, outputs)
            if shared:
                raise SharedCheckpoint(shared, also=message)
            raise WorkersFailed(message, failure.failed, failure.late)
        missing = sorted(set(range(self.workers)) - set(outputs))
        if missing:
            raise RuntimeError(
                f"no output of worker(s) {', '.join(map(str, missing))} in {run_dir}"
                + (f" after {self.timeout:g} s: did their hosts run this implementation "
                   f"with the same {SHARED_DIR}?" if cluster is not None else ""))
        for output in outputs.values():
            if output.error:   # a worker that wrote an error and still exited 0
                raise RuntimeError(f"worker {output.worker}: {output.error}")
        if shared:
            raise SharedCheckpoint(shared)
        return trace

    def _run_workers(self, job: "WorkerJob", pickled: bytes, run_dir: Path, tasks: list[int],
                     cluster: Cluster | None) -> None:
        if cluster is None:
            cluster = Cluster.loopback(self.workers)
            configs = {task: cluster.tf_config(task) for task in tasks}
        else:
            configs = {cluster.task: os.environ["TF_CONFIG"]}
        run_dir.mkdir(parents=True, exist_ok=True)
        job_path = run_dir / f"job-{'-'.join(map(str, tasks))}.pkl"
        job_path.write_bytes(pickled)
        with WorkerGroup(run_dir, grace=self.grace, stop_signal=STOP_SIGNAL) as group:
            for task in tasks:
                group.start(task, [sys.executable, "-m", WORKER_MODULE, str(job_path), str(task)],
                            env=worker_environment(configs[task]))
            job.pids.update(group.pids)
            group.wait(self.timeout, check=StartupWatch(cluster, tasks, run_dir,
                                                        self.startup_timeout))


class StartupWatch:
    """The start-up check of `WorkerGroup.wait`: once `seconds` have passed and a worker this
    process started has not yet created its `CONNECTED` file (the cluster formed), name the
    workers of the cluster that never accepted a connection. TensorFlow itself waits for them
    in `MultiWorkerMirroredStrategy()` (an hour, holding the interpreter, so a worker cannot
    time itself out); a worker listens on its address from the moment it starts its strategy.
    """

    def __init__(self, cluster: Cluster, tasks: list[int], run_dir: Path, seconds: float):
        self.cluster, self.tasks, self.run_dir = cluster, tasks, run_dir
        self.seconds, self.started, self.formed = seconds, time.monotonic(), False

    def __call__(self) -> tuple[str, list[int]] | None:
        if self.formed or time.monotonic() - self.started < self.seconds:
            return None
        waiting = [t for t in self.tasks if not (output_dir(self.run_dir, t) / CONNECTED).exists()]
        if not waiting:
            self.formed = True
            return None
        return self.message(), waiting

    def message(self) -> str:
        others = dict(enumerate(self.cluster.addresses))
        silent = {i: a for i, a in others.items() if not accepting(a)}
        if not silent:
            return (f"the cluster did not form within {self.seconds:g} s (startup_timeout) "
                    f"although every worker accepts connections ({', '.join(others.values())}):"
                    f" does every host run this implementation with the same TF_CONFIG cluster?")
        names = ", ".join(f"worker {i} ({a})" for i, a in sorted(silent.items()))
        return (f"{names} never connected within {self.seconds:g} s (startup_timeout): nothing "
                f"accepts connections at that address, so its host has not started this "
                f"implementation (or it failed before connecting). Start it there with the same "
                f"TF_CONFIG cluster, or raise MultiWorkerLoopRunner.startup_timeout when hosts "
                f"start minutes apart")


class SharedCheckpoint(RuntimeError):
    """Two or more workers wrote a checkpoint to the same path."""

    def __init__(self, shared: list["CheckpointWrite"], also: str = ""):
        first = shared[0]
        paths = "; ".join(f"{w.path} by workers {', '.join(map(str, w.workers))}"
                          for w in shared[:5])
        more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
        super().__init__(
            f"workers wrote the same checkpoint path after step {first.after_step}: {paths}"
            f"{more}. "
            f"On a shared filesystem they race (one worker's save can delete the files another "
            f"is merging, or leave a mixed checkpoint). Have the chief (the 'chief' task, or "
            f"worker 0 of a cluster without one) save to the real path and every other worker "
            f"to a temporary path of its own; the run "
            f"is judged up to step {first.after_step}"
            + (f"\nA worker also failed (in the race, or later):\n{also}" if also else ""))
        self.shared = shared


@dataclasses.dataclass
class WorkerJob:
    """What every worker process is given (pickled): the run request with a case holding
    only this implementation, the runner, and how the replicas split."""

    request: RunRequest
    runner: MultiWorkerLoopRunner
    replicas_per_worker: int
    workers: int
    pids: dict[int, int] = dataclasses.field(default_factory=dict)

    def pickled(self) -> bytes:
        """The job as its workers read it; a TypeError saying what to change when it does not
        pickle."""
        try:
            return pickle.dumps(self)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            build = getattr(self.runner.build_loop, "__qualname__", repr(self.runner.build_loop))
            raise TypeError(
                f"{self.request.implementation.name}: MultiWorkerLoopRunner sends the case and "
                f"build_loop to its worker processes by pickle, and they do not pickle ({e}). "
                f"build_loop is {build}: give a module-level function or class, or "
                f"functools.partial of one with picklable arguments (closures and lambdas do "
                f"not pickle)") from None

    @staticmethod
    def load(path: Path) -> "WorkerJob":
        return pickle.loads(Path(path).read_bytes())


def _for_workers(request: RunRequest, run_dir: Path) -> RunRequest:
    """The request as the workers get it: a case holding only this implementation (the others'
    runners need not pickle) and the run directory as the work directory, so the loop's own
    files (checkpoints) are where every worker can see them."""
    implementation = request.implementation
    case = dataclasses.replace(request.case, implementations=(implementation,), pairs=(),
                               reference=implementation.name, noise_variants={}, oracle=None,
                               sensitivity=(), sensitivity_candidates=())
    return RunRequest(case=case, implementation=implementation, steps=request.steps,
                      initial_values=request.initial_values, device=request.device,
                      workdir=run_dir, capture_steps=request.capture_steps,
                      tpu_name=request.tpu_name, trace=Trace(implementation.name))


def worker_environment(tf_config: str) -> dict[str, str]:
    """A worker's environment: this one, with its `TF_CONFIG`, this `verify` first on
    `PYTHONPATH`, and this process's import path in `IMPORT_PATH`, which the worker appends to
    its own (so it imports the same case modules, and a directory put on this process's path
    later, such as a case source, cannot hide the standard library from it)."""
    env = dict(os.environ)
    env["TF_CONFIG"] = tf_config
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, env.get("PYTHONPATH", "").split(
        os.pathsep))])
    paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    env[IMPORT_PATH] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def extend_import_path() -> None:
    """In a worker: append the starting process's import path (`IMPORT_PATH`) to this one."""
    for path in os.environ.get(IMPORT_PATH, "").split(os.pathsep):
        if path and path not in sys.path:
            sys.path.append(path)


def _shared_dir(request: RunRequest) -> Path:
    shared = os.environ.get(SHARED_DIR, "").strip()
    if not shared:
        raise ClusterConfigError(
            f"TF_CONFIG is set, so this process runs one worker of a real cluster; set "
            f"{SHARED_DIR} to a directory every host mounts at the same path (the workers' "
            f"traces meet there), or unset TF_CONFIG to run the workers on this machine")
    return Path(shared).absolute() / request.case.name / request.implementation.name


def _port_taken(run_dir: Path, failed: tuple[int, ...]) -> bool:
    for task in failed:
        try:
            log = (run_dir / f"worker-{task}.log").read_text(errors="replace")
        except OSError:
            continue
        if any(marker in log for marker in PORT_TAKEN):
            return True
    return False


def _remaining(timeout: float | None, started: float) -> float | None:
    return None if timeout is None else max(0.0, timeout - (time.monotonic() - started))


def _with_worker_errors(failure: WorkersFailed, outputs: Mapping[int, "WorkerOutput"]) -> str:
    """The failure's message led by the first error a failed worker reported itself (a worker
    the runner stopped reports only that), followed by every worker's reported error.

    >>> stopped = WorkerOutput(0, {}, {}, [], error="StoppedByRunner: stopped by the runner")
    >>> failed = WorkerOutput(1, {}, {}, [], error="ValueError: bad labels")
    >>> print(_with_worker_errors(WorkersFailed("worker 1 failed.", (1,)), {0: stopped, 1: failed}))
    worker 1: ValueError: bad labels
    worker 1 failed.
    worker 0: StoppedByRunner: stopped by the runner
    worker 1: ValueError: bad labels
    """
    errors = [f"worker {w}: {o.error}" for w, o in sorted(outputs.items()) if o.error]
    causes = [f"worker {w}: {outputs[w].error}" for w in failure.failed
              if w in outputs and outputs[w].error]
    if not causes:
        return "\n".join([str(failure), *errors])
    return "\n".join([causes[0].splitlines()[0], str(failure), *errors])


# ---- what a worker writes, and joining it ----

@dataclasses.dataclass(frozen=True)
class CheckpointWrite:
    path: str
    after_step: int
    workers: tuple[int, ...] = ()


@dataclasses.dataclass
class WorkerOutput:
    """What one worker wrote: its replicas' losses and batches per step, the checkpoint
    paths it wrote (after which step), its error if it raised, and (the chief) its trace."""

    worker: int
    losses: dict[int, dict[int, np.ndarray]]                 # step -> replica -> loss
    batches: dict[int, dict[int, dict[str, Any]]]            # step -> replica -> batch
    checkpoints: list[tuple[str, int]]
    error: str | None = None
    trace: Trace | None = None


def output_dir(run_dir: Path, worker: int) -> Path:
    return Path(run_dir) / f"worker-{worker}"


class ReplicaLog:
    """A worker's record of what its replicas consumed, step by step (`StepTaps.on_replicas`).

    >>> import tempfile
    >>> log = ReplicaLog()
    >>> log.add(1, {2: np.float32(0.5)}, {2: {"x": np.ones(2)}})
    >>> path = log.save(Path(tempfile.mkdtemp()) / "replicas.npz")
    >>> losses, batches = ReplicaLog.load(path)
    >>> float(losses[1][2]), batches[1][2]["x"].tolist()
    (0.5, [1.0, 1.0])
    """

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, step: int, losses: Mapping[int, Any], batches: Mapping[int, Mapping]) -> None:
        for replica, loss in losses.items():
            self.arrays[f"{step}/{replica}/loss"] = np.asarray(loss, np.float32)
        for replica, batch in batches.items():
            for name, value in batch.items():
                if isinstance(value, tuple):     # sparse: (indices, values, dense_shape)
                    for part, array in zip(("indices", "values", "shape"), value):
                        self.arrays[f"{step}/{replica}/batch/{name}::{part}"] = np.asarray(array)
                else:
                    self.arrays[f"{step}/{replica}/batch/{name}"] = np.asarray(value)

    def save(self, path: Path) -> Path:
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **self.arrays)
        os.replace(tmp, path)
        return path

    @staticmethod
    def load(path: Path):
        losses: dict[int, dict[int, np.ndarray]] = {}
        batches: dict[int, dict[int, dict[str, Any]]] = {}
        with np.load(path) as stored:
            for key in stored.files:
                step, replica, kind, *rest = key.split("/", 3)
                step, replica = int(step), int(replica)
                if kind == "loss":
                    losses.setdefault(step, {})[replica] = stored[key]
                    continue
                name, _, part = rest[0].partition("::")
                batch = batches.setdefault(step, {}).setdefault(replica, {})
                if not part:
                    batch[name] = stored[key]
                else:
                    parts = batch.setdefault(name, {})
                    parts[part] = stored[key]
        for by_replica in batches.values():
            for batch in by_replica.values():
                for name, value in list(batch.items()):
                    if isinstance(value, dict):
                        batch[name] = (value["indices"], value["values"], value["shape"])
        return losses, batches


def collect_outputs(run_dir: Path, workers: int,
                    wait: float | None = None) -> dict[int, WorkerOutput]:
    """Every worker's output that is there (a worker that died early wrote none). `wait`
    seconds: on real hosts, how long to wait for other hosts' workers to finish writing."""
    deadline = None if wait is None else time.monotonic() + wait
    outputs = {}
    for worker in range(workers):
        directory = output_dir(run_dir, worker)
        marker = directory / "worker.json"
        while deadline is not None and not marker.is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not marker.is_file():
            continue
        doc = json.loads(marker.read_text())
        losses, batches = ({}, {})
        if (directory / "replicas.npz").is_file():
            losses, batches = ReplicaLog.load(directory / "replicas.npz")
        trace = Trace.load(directory / "trace") if (directory / "trace.json").is_file() else None
        outputs[worker] = WorkerOutput(worker, losses, batches,
                                       [(c["path"], int(c["after_step"]))
                                        for c in doc.get("checkpoints", [])],
                                       doc.get("error"), trace)
    return outputs


def join_outputs(trace: Trace, outputs: Mapping[int, WorkerOutput], replicas: int, *,
                 capture_steps: bool = True) -> Trace:
    """Fill `trace` from the workers' outputs: everything the chief (worker 0) recorded but its
    loss and input, which cover its own replicas only; then each step's loss and input from
    every worker's replicas (recorded when all `replicas` sent theirs)."""
    chief = outputs.get(0)
    if chief is not None and chief.trace is not None:
        for key, value in chief.trace.values.items():
            if key.quantity not in ("loss", "input") or not capture_steps:
                trace.values[key] = value
        trace.meta.replicas = chief.trace.meta.replicas
        trace.meta.capture_every = chief.trace.meta.capture_every
        trace.meta.details.update(chief.trace.meta.details)
    if capture_steps:
        steps = sorted({s for o in outputs.values() for s in (*o.losses, *o.batches)})
        for step in steps:
            losses = {r: v for o in outputs.values() for r, v in o.losses.get(step, {}).items()}
            batches = {r: v for o in outputs.values() for r, v in o.batches.get(step, {}).items()}
            record_loss_and_input(trace, step, losses, batches, replicas)
    return trace


def shared_checkpoints(outputs: Mapping[int, WorkerOutput],
                       relative_to: Path | None = None) -> list[CheckpointWrite]:
    """Checkpoint paths that more than one worker wrote, earliest first (paths under
    `relative_to` written relative to it, so reports do not hold a temporary directory).

    >>> a = WorkerOutput(0, {}, {}, [("/r/ckpt-1", 20)])
    >>> b = WorkerOutput(1, {}, {}, [("/r/ckpt-1", 20), ("/r/tmp/ckpt-1", 20)])
    >>> shared_checkpoints({0: a, 1: b})
    [CheckpointWrite(path='/r/ckpt-1', after_step=20, workers=(0, 1))]
    """
    writers: dict[str, dict[int, int]] = {}
    for worker, output in outputs.items():
        for path, step in output.checkpoints:
            if relative_to is not None and Path(path).is_relative_to(relative_to):
                path = str(Path(path).relative_to(relative_to))
            writers.setdefault(path, {}).setdefault(worker, step)
    shared = [CheckpointWrite(path, min(by.values()), tuple(sorted(by)))
              for path, by in writers.items() if len(by) > 1]
    return sorted(shared, key=lambda w: (w.after_step, w.path))


def cut_after(trace: Trace, step: int) -> None:
    """Drop what `trace` recorded after `step` (a run judged as if it had stopped there)."""
    for key in [k for k in trace.values if k.step > step]:
        del trace.values[key]

