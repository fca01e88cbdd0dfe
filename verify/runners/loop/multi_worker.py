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
float32 sum of every replica's loss in replica order and its input covers every
replica's batch in replica order, as `StepTaps` records them for replicas in one process.

Every worker also reports each checkpoint it wrote (`tf.train.Checkpoint.save`/`write`,
`CheckpointManager.save`): two workers writing the same path race on a shared filesystem (the
MultiWorkerMirroredStrategy guides have only the chief write the real path, the others a
temporary one), so the run fails there, after the last step before that save.

Workers that fail or hang are stopped and reported with their logs (`WorkerGroup`); no worker
outlives its run.

The workers' start-up (their environment, the watch on the cluster forming) is in
`verify.runners.loop.worker_startup`; what they write and how it is joined into one trace, in
`verify.runners.loop.worker_outputs`.

>>> MultiWorkerLoopRunner(build_loop=MyLoop, workers=2)  # doctest: +SKIP
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Mapping

from verify.core.trace import Trace
from verify.runners.loop.cluster import Cluster, ClusterConfigError, port_in_use
from verify.runners.loop.runner import LoopRunner
from verify.core.runner import RunRequest
from verify.runners.loop.worker_outputs import (CheckpointWrite, SharedCheckpoint, WorkerOutput,
                                                collect_outputs, cut_after, join_outputs,
                                                shared_checkpoints)
from verify.runners.loop.worker_startup import StartupWatch, port_taken, worker_environment
from verify.runners.worker_group import WorkerGroup, WorkersFailed

SHARED_DIR = "PARITY_SHARED_DIR"   # on real hosts: where every worker's files meet
WORKER_MODULE = "verify.runners.loop.worker"
# How the runner asks a worker to stop (then SIGKILL after the grace period): not SIGTERM, on
# which a MultiWorkerMirroredStrategy worker keeps running (TensorFlow's preemption notifier
# catches it; seen on TF 2.15.1).
STOP_SIGNAL = signal.SIGUSR2
PORT_ATTEMPTS = 3    # a loopback port taken between choosing it and the worker binding it


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

    # no layer replay: the workers' taps would each see their own replicas' share only
    capabilities: ClassVar[frozenset[str]] = frozenset({"mutations", "nudges"})
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
        run_dir, tasks = self._run_dir_and_tasks(request, cluster)
        job = WorkerJob(request=_for_workers(request, run_dir), runner=self,
                        replicas_per_worker=per_worker, workers=self.workers)
        pickled = job.pickled()     # before anything is started or written
        # filled as the workers start, so a run stopped midway still says whom it started
        request.trace.meta.details["worker_pids"] = job.pids
        started = time.monotonic()
        failure = self._run_attempts(request, job, pickled, run_dir, tasks, cluster)
        # On real hosts the other workers' files arrive from their hosts; wait for them only
        # when this host's worker finished.
        wait = None if cluster is None or failure else _remaining(self.timeout, started)
        outputs = collect_outputs(run_dir, self.workers, wait=wait)
        trace = join_outputs(request.trace, outputs, implementation.replicas,
                             capture_steps=request.capture_steps)
        trace.meta.details.update({"workers": self.workers, "replicas_per_worker": per_worker,
                                   "cluster": "loopback" if cluster is None else "TF_CONFIG",
                                   "worker_processes": _started_as(job.forked)})
        # Workers that write one checkpoint path can fail in the race (a save deleting the
        # files another is merging): the shared path is then the cause to report.
        shared = shared_checkpoints(outputs, relative_to=run_dir)
        if shared:
            cut_after(trace, shared[0].after_step)
        self._raise_what_failed(failure, outputs, shared, run_dir, cluster)
        return trace

    def _run_dir_and_tasks(self, request: RunRequest,
                           cluster: Cluster | None) -> tuple[Path, list[int]]:
        """Where the workers' files meet and the tasks this process starts: every worker, in
        the work directory (no TF_CONFIG: a loopback cluster), or this host's own, in
        `SHARED_DIR` (a real cluster, whose TF_CONFIG is checked first)."""
        implementation = request.implementation
        if cluster is None:
            return request.workdir / f"{implementation.name}.workers", list(range(self.workers))
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
        return run_dir, tasks

    def _run_attempts(self, request: RunRequest, job: "WorkerJob", pickled: bytes,
                      run_dir: Path, tasks: list[int],
                      cluster: Cluster | None) -> WorkersFailed | None:
        """Run the workers, again (up to `PORT_ATTEMPTS` times) when a loopback port was
        taken before a worker bound it; the last failure, or None. A run stopped midway (a
        time limit, ^C) still fills its trace with what the workers wrote before it raises."""
        failure = None
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._run_workers(job, pickled, run_dir, tasks, cluster)
                    failure = None
                    break
                except WorkersFailed as e:
                    failure = e
                    if cluster is not None or not port_taken(run_dir, e.failed) \
                            or attempt == PORT_ATTEMPTS:
                        break
        except BaseException:   # a time limit, ^C: the steps the stopped chief wrote count
            join_outputs(request.trace, collect_outputs(run_dir, self.workers),
                         request.implementation.replicas, capture_steps=request.capture_steps)
            raise
        return failure

    def _raise_what_failed(self, failure: WorkersFailed | None,
                           outputs: Mapping[int, WorkerOutput], shared: list[CheckpointWrite],
                           run_dir: Path, cluster: Cluster | None) -> None:
        """Raise for a failed worker, a worker without output or one that reported an error,
        or a checkpoint path several workers wrote (the cause, when a worker also failed)."""
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
                            env=worker_environment(configs[task]),
                            fork_server=worker_fork_server())
            job.pids.update(group.pids)
            job.forked.update({index: not isinstance(worker.process, subprocess.Popen)
                               for index, worker in group.workers.items()})
            group.wait(self.timeout, check=StartupWatch(cluster, tasks, run_dir,
                                                        self.startup_timeout))


@dataclasses.dataclass
class WorkerJob:
    """What every worker process is given (pickled): the run request with a case holding
    only this implementation, the runner, and how the replicas split."""

    request: RunRequest
    runner: MultiWorkerLoopRunner
    replicas_per_worker: int
    workers: int
    pids: dict[int, int] = dataclasses.field(default_factory=dict)
    forked: dict[int, bool] = dataclasses.field(default_factory=dict)   # by the fork server?

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


_FORK_SERVER: list = []   # this process's, made at its first multi-worker run


def worker_fork_server():
    """The fork server this process starts its workers from (`verify.runners.fork_server`:
    TensorFlow imported once, not once per worker), made at first use, stopped at exit."""
    if not _FORK_SERVER:
        from verify.runners.fork_server import ForkServer

        environment = worker_environment("")
        environment.pop("TF_CONFIG")
        _FORK_SERVER.append(ForkServer(WORKER_MODULE, environment))
        atexit.register(_FORK_SERVER[0].close)
    return _FORK_SERVER[0]


def _started_as(forked: Mapping[int, bool]) -> str:
    """How the last attempt's workers were started, for the trace's details.

    >>> _started_as({0: False, 1: False}), _started_as({})
    ('fresh processes', 'none started')
    """
    kinds = set(forked.values())
    if not kinds:
        return "none started"
    if kinds == {True}:
        return "forked from a process that had imported TensorFlow and run nothing"
    return "fresh processes" if kinds == {False} else "some forked, some fresh"


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


def _shared_dir(request: RunRequest) -> Path:
    shared = os.environ.get(SHARED_DIR, "").strip()
    if not shared:
        raise ClusterConfigError(
            f"TF_CONFIG is set, so this process runs one worker of a real cluster; set "
            f"{SHARED_DIR} to a directory every host mounts at the same path (the workers' "
            f"traces meet there), or unset TF_CONFIG to run the workers on this machine")
    return Path(shared).absolute() / request.case.name / request.implementation.name


def _remaining(timeout: float | None, started: float) -> float | None:
    return None if timeout is None else max(0.0, timeout - (time.monotonic() - started))


def _with_worker_errors(failure: WorkersFailed, outputs: Mapping[int, WorkerOutput]) -> str:
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
