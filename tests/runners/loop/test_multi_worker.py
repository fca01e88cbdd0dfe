"""The multi-worker loop runner: the user's loop on two worker processes, joined into one trace
equal to the order-matched single-device reference, capture inert, workers that raise, crash
or hang stopped and reported with their logs (no worker outlives its run), a TF_CONFIG given by
the environment used instead of a made one, and mistakes in the request reported before any
worker starts.

The TensorFlow tests run the custom-loop case on a tiny synthetic set (64 examples, 8 per
replica: 4 steps at 2 workers x 1 replica).
"""
import dataclasses
import doctest
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from processes import alive
from tiny_loop import CASE_SOURCE, differing_values, tiny_loop_case

from cases.custom_loop.multi_worker import MultiWorkerLoop, worker_order
from verify.core.trace import Trace
from verify.runners import worker_group
from verify.runners.loop import multi_worker
from verify.runners.loop.cluster import Cluster, ClusterConfigError
from verify.runners.loop.multi_worker import MultiWorkerLoopRunner
from verify.runners.loop.worker_outputs import ReplicaLog, WorkerOutput, join_outputs
from verify.core.runner import RunRequest
from verify.runners.capture.step_record import StepRecorder

# ---- without TensorFlow ----

def test_docstring_examples():
    result = doctest.testmod(multi_worker, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_worker_order_is_how_sharded_workers_hold_a_batch():
    # 2 workers x 2 replicas of 4: worker 0 reads examples 0, 2, 4, ... of the shuffle
    assert worker_order(16, 2, 8).tolist() == [0, 2, 4, 6, 8, 10, 12, 14,
                                               1, 3, 5, 7, 9, 11, 13, 15]
    assert sorted(worker_order(7, 2, 4).tolist()) == list(range(7))


def test_the_loss_and_input_of_a_step_join_every_workers_replicas_in_order():
    chief, other = ReplicaLog(), ReplicaLog()
    chief.add(1, {0: np.float32(0.1), 1: np.float32(0.2)},
              {0: {"x": np.array([0.0])}, 1: {"x": np.array([1.0])}})
    other.add(1, {2: np.float32(0.3), 3: np.float32(0.4)},
              {2: {"x": np.array([2.0])}, 3: {"x": np.array([3.0])}})
    chief_trace = Trace("mw")
    chief_trace.record(1, "loss", "loss", np.float32(0.3))   # its own replicas only
    chief_trace.record(1, "weight", "w", np.ones(2, np.float32))
    outputs = {0: WorkerOutput(0, *_loaded(chief), [], trace=chief_trace),
               1: WorkerOutput(1, *_loaded(other), [])}
    joined = join_outputs(Trace("mw"), outputs, replicas=4)
    expected = Trace("one process")
    StepRecorder(expected).replica_step(1, {r: np.float32(v) for r, v in
                                            enumerate([0.1, 0.2, 0.3, 0.4])},
                                        {r: {"x": np.array([float(r)])} for r in range(4)}, 4)
    assert joined.get(1, "loss", "loss") == expected.get(1, "loss", "loss")
    assert joined.get(1, "input", "x") == expected.get(1, "input", "x")
    assert joined.get(1, "weight", "w").tolist() == [1.0, 1.0]
    # a step a worker did not send stays without loss and input
    del outputs[1]
    partial = join_outputs(Trace("mw"), outputs, replicas=4)
    assert partial.get(1, "loss", "loss") is None and partial.get(1, "input", "x") is None


def _loaded(log: ReplicaLog):
    import tempfile

    return ReplicaLog.load(log.save(Path(tempfile.mkdtemp()) / "replicas.npz"))


def test_tf_config_forms_and_mistakes():
    config = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},
                         "task": {"type": "worker", "index": 1}})
    cluster = Cluster.from_tf_config(config)
    assert (cluster.addresses, cluster.task, cluster.workers) == (("a:1", "b:1", "c:1"), 2, 3)
    assert json.loads(cluster.tf_config(2)) == json.loads(config)
    assert json.loads(cluster.tf_config(0))["task"] == {"type": "chief", "index": 0}
    for text, says in [
        ("{not json", "is not JSON"),
        ('{"cluster": {"worker": ["a:1"]}}', 'needs a "task" object'),
        ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker"}}', '"host:port"'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
         "task worker 3 is not in"),
        ('{"cluster": {"worker": ["a:1"], "evaluator": ["b:1"]}, '
         '"task": {"type": "evaluator", "index": 0}}', "this process is the evaluator"),
    ]:
        with pytest.raises(ClusterConfigError, match=says):
            Cluster.from_tf_config(text)
    assert len(set(Cluster.loopback(3).addresses)) == 3


def request_for(case, name, tmp_path, **changes) -> RunRequest:
    implementation = case.implementation(name)
    if changes:
        implementation = dataclasses.replace(
            implementation, runner=dataclasses.replace(implementation.runner, **changes))
    return RunRequest(case=case, implementation=implementation, steps=case.steps,
                      initial_values=implementation.names.to_native(case.initial_values),
                      device="cpu", workdir=tmp_path)


def test_mistakes_in_the_request_are_reported_before_any_worker_starts(tmp_path, monkeypatch):
    case = tiny_loop_case()
    monkeypatch.delenv("TF_CONFIG", raising=False)
    uneven = dataclasses.replace(case.implementation("multi-worker-2x1"), replicas=3)
    with pytest.raises(ValueError, match="3 replicas do not split evenly over 2 workers"):
        uneven.runner.run(RunRequest(case, uneven, 4, {}, "cpu", tmp_path))
    with pytest.raises(TypeError, match="closures and lambdas do not pickle"):
        request = request_for(case, "multi-worker-2x1", tmp_path,
                              build_loop=lambda strategy, context: None)
        request.implementation.runner.run(request)
    with pytest.raises(ValueError, match="neither after_training nor global_batch_replicas"):
        MultiWorkerLoopRunner(build_loop=MultiWorkerLoop, global_batch_replicas=2)
    monkeypatch.setenv("TF_CONFIG", Cluster(("a:1", "b:1", "c:1"), task=0).tf_config(0))
    with pytest.raises(ClusterConfigError, match="TF_CONFIG lists 3 workers"):
        request = request_for(case, "multi-worker-2x1", tmp_path)
        request.implementation.runner.run(request)
    monkeypatch.setenv("TF_CONFIG", Cluster(("a:1", "b:1"), task=1).tf_config(1))
    monkeypatch.delenv(multi_worker.SHARED_DIR, raising=False)
    with pytest.raises(ClusterConfigError, match="set PARITY_SHARED_DIR"):
        request = request_for(case, "multi-worker-2x1", tmp_path)
        request.implementation.runner.run(request)
    with pytest.raises(ValueError, match="startup_timeout must be > 0"):
        MultiWorkerLoopRunner(build_loop=MultiWorkerLoop, startup_timeout=0)
    assert not list(tmp_path.iterdir())      # nothing started, nothing written


def test_a_port_of_tf_config_taken_by_another_process_is_said_before_any_worker_starts(
        tmp_path, monkeypatch):
    import socket

    case = tiny_loop_case()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    monkeypatch.setenv(multi_worker.SHARED_DIR, str(tmp_path / "shared"))
    try:
        monkeypatch.setenv("TF_CONFIG", Cluster((address, "127.0.0.1:1"), task=0).tf_config(0))
        with pytest.raises(ClusterConfigError,
                           match=f"worker \\(task 0\\) the address {address}, and another "
                                 f"process already listens on that port"):
            request = request_for(case, "multi-worker-2x1", tmp_path)
            request.implementation.runner.run(request)
    finally:
        taken.close()
    assert not (tmp_path / "shared").exists()
    # negative control: the same port once free passes the check
    from verify.runners.loop.cluster import port_in_use

    assert not port_in_use(address)


def test_the_startup_watch_names_the_workers_that_never_listened(tmp_path):
    import socket

    from verify.runners.loop.cluster import accepting
    from verify.runners.loop.worker_outputs import output_dir
    from verify.runners.loop.worker_startup import CONNECTED, StartupWatch

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    alive_at = f"127.0.0.1:{listening.getsockname()[1]}"
    silent_at = Cluster.loopback(1).addresses[0]
    try:
        assert accepting(alive_at) and not accepting(silent_at)
        cluster = Cluster((alive_at, silent_at), task=0)
        assert StartupWatch(cluster, [0], tmp_path, seconds=60)() is None   # not yet
        headline, late = StartupWatch(cluster, [0], tmp_path, seconds=0)()
        assert late == [0]
        assert headline.startswith(f"worker 1 ({silent_at}) never connected within 0 s "
                                   f"(startup_timeout)"), headline
        assert "worker 0" not in headline        # it listens
        everyone = Cluster((alive_at, alive_at), task=0)
        headline, _ = StartupWatch(everyone, [0], tmp_path, seconds=0)()
        assert headline.startswith("the cluster did not form within 0 s")
        # negative control: a worker whose cluster formed is not blamed
        output_dir(tmp_path, 0).mkdir()
        (output_dir(tmp_path, 0) / CONNECTED).touch()
        assert StartupWatch(cluster, [0], tmp_path, seconds=0)() is None
    finally:
        listening.close()


# ---- with TensorFlow: two worker processes ----

class RaisingLoop(MultiWorkerLoop):
    """The chief raises before its first step; worker 1 then waits in the step's all-reduce."""

    def train_epoch(self):
        if self.strategy.cluster_resolver.task_id == 0:
            print("the chief's data:", "corrupt", flush=True)
            raise ValueError("labels out of range: 12 (the chief's own error)")
        return super().train_epoch()


class CrashingLoop(MultiWorkerLoop):
    """Worker 1 dies without a word (os._exit) after its first step."""

    def train_epoch(self):
        if self.strategy.cluster_resolver.task_id == 1:
            iterator = iter(self.train_dist_dataset)
            self.distributed_train_step(next(iterator))
            os._exit(7)
        return super().train_epoch()


MARKERS = "SLOW_LOOP_WAITING_DIR"   # where a worker's loop tells the test it got somewhere


def tell_the_test(what: str) -> None:
    """In a worker: leave a marker file saying `what` for the test's TimeLimitTrigger."""
    markers = os.environ.get(MARKERS)
    if markers:
        Path(markers, what.replace(" ", "-")).touch()


class HangingLoop(MultiWorkerLoop):
    """Worker 1 never reaches its first step; the chief waits in the all-reduce."""

    def train_epoch(self):
        if self.strategy.cluster_resolver.task_id == 1:
            print("worker 1 is stuck", flush=True)
            tell_the_test("worker 1 is stuck")
            time.sleep(3600)
        return super().train_epoch()


class SlowLoop(MultiWorkerLoop):
    """Both workers train 2 steps, then wait in Python (a slow input pipeline, say)."""

    def train_epoch(self):
        step, taken = self.distributed_train_step, []

        def slow_step(batch):
            if len(taken) == 2:
                print("waiting for more data", flush=True)
                tell_the_test(f"worker {os.getpid()} trained 2 steps")
                # in slices, as a polling input pipeline waits: the stop signal's handler runs
                # between them (one long sleep was seen not to wake for it within the grace)
                for _ in range(36000):
                    time.sleep(0.1)
            taken.append(batch)
            return step(batch)

        self.distributed_train_step = slow_step
        return super().train_epoch()


def run_loop(case, loop_class, tmp_path, run_timeout=None, **runner_changes):
    """`loop_class` in place of the faithful loop of multi-worker-2x1; `run_timeout` is the
    session's --run-timeout, `runner_changes` change the runner (its own `timeout`, ...)."""
    from verify.runners.run import run_implementation

    base = case.implementation("multi-worker-2x1")
    runner = dataclasses.replace(base.runner, build_loop=functools.partial(loop_class),
                                 **runner_changes)
    implementation = dataclasses.replace(base, name=f"mw-{loop_class.__name__}", runner=runner)
    return run_implementation(case, implementation, workdir=tmp_path, timeout=run_timeout)


@pytest.mark.slow
def test_a_worker_that_raises_stops_the_run_with_its_error_and_log(tmp_path):
    case = tiny_loop_case()
    started = time.monotonic()
    trace = run_loop(case, RaisingLoop, tmp_path, grace=1.0)
    assert time.monotonic() - started < 120
    error = trace.error
    assert error.startswith("WorkersFailed: worker 0: ValueError: labels out of range: 12")
    # worker 1 is stopped by the runner, or (a race) has already exited on its own because its
    # peer is gone: either way its fate is said
    fate = re.search(r"worker 1 \(pid \d+\): (stopped by the runner|exited with status \d+)",
                     error)
    assert fate, error
    assert "the chief's data: corrupt" in error           # the failing worker's log tail
    pids = trace.meta.details["worker_pids"]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids.values())


@pytest.mark.slow
def test_a_worker_that_crashes_mid_run_stops_the_run(tmp_path):
    case = tiny_loop_case()
    trace = run_loop(case, CrashingLoop, tmp_path, grace=1.0)
    assert trace.error.startswith("WorkersFailed: worker 1 failed.")
    assert "exited with status 7" in trace.error
    assert "worker 0 (pid" in trace.error and "stopped by the runner" in trace.error
    pids = trace.meta.details["worker_pids"]
    assert not any(alive(pid) for pid in pids.values())


@pytest.mark.slow
def test_hanging_workers_are_stopped_at_the_runners_timeout_and_the_run_time_limit(
        tmp_path, monkeypatch):
    case = tiny_loop_case()
    # The runner's own timeout, 60 s: its clock is moved 60 s on once worker 1 says it hangs,
    # so the deadline passes at a known point without the test sleeping through it.
    with ClockJump(tmp_path / "stuck", monkeypatch, seconds=60.0) as jump:
        trace = run_loop(case, HangingLoop, tmp_path / "own", grace=1.0, timeout=60.0)
    assert jump.jumped
    assert "the workers did not finish within 60 s (still running: worker 0, worker 1)" \
        in trace.error
    assert "worker 1 is stuck" in trace.error
    assert not any(alive(pid) for pid in trace.meta.details["worker_pids"].values())

    # the session's --run-timeout (a signal in the runner's process) stops them too; it is
    # fired once worker 1 hangs, so the stop is timed from there
    with TimeLimitTrigger(tmp_path / "waiting", monkeypatch, count=1) as trigger:
        trace = run_loop(case, HangingLoop, tmp_path / "session", timeout=None, grace=1.0,
                         run_timeout=300.0)
        stopped_after = time.monotonic() - trigger.fired_at
    assert trigger.fired and stopped_after < 30          # the workers stopped promptly
    assert trace.error.startswith("RunTimeout: timed out after 300 s")
    pids = trace.meta.details["worker_pids"]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids.values())


class MarkerWatch:
    """Call `fire()` once `count` workers have told the test (`tell_the_test`) they got where
    it needs them: the run is acted on at a known point however slowly a busy machine starts
    it. Leaving the `with` block stops the watch, so it can never fire into a later test."""

    def __init__(self, files: Path, monkeypatch, count: int):
        files.mkdir()
        monkeypatch.setenv(MARKERS, str(files))   # the workers inherit it
        self.files, self.count = files, count
        self.done = threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)

    def watch(self):
        while not self.done.wait(0.2):
            if len(list(self.files.iterdir())) >= self.count:
                self.fire()
                return

    def fire(self):
        raise NotImplementedError

    def __enter__(self):
        self.watcher.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.watcher.join()


class ClockJump(MarkerWatch):
    """Move the worker group's clock (`time.monotonic` as `verify.runners.worker_group` reads
    it) `seconds` on once a worker says it hangs: a deadline within those seconds then passes
    at once."""

    def __init__(self, files: Path, monkeypatch, seconds: float):
        super().__init__(files, monkeypatch, count=1)
        self.seconds, self.jumped = seconds, False
        real = time.monotonic
        clock = type("Clock", (), {"monotonic": staticmethod(
            lambda: real() + (self.seconds if self.jumped else 0.0)),
            "sleep": staticmethod(time.sleep)})
        monkeypatch.setattr(worker_group, "time", clock)

    def fire(self):
        self.jumped = True


class TimeLimitTrigger(MarkerWatch):
    """Fire the armed time limit (SIGALRM, as its timer would) once `count` workers have told
    the test they got where it needs them."""

    fired, fired_at = False, None

    def fire(self):
        self.fired, self.fired_at = True, time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.01)


@pytest.mark.slow
def test_a_run_stopped_by_the_time_limit_keeps_the_steps_the_chief_captured(tmp_path,
                                                                            monkeypatch):
    case = tiny_loop_case()
    with TimeLimitTrigger(tmp_path / "waiting", monkeypatch, count=2) as trigger:
        trace = run_loop(case, SlowLoop, tmp_path / "run", timeout=None, grace=20.0,
                         run_timeout=300.0)
    assert trigger.fired                                    # stopped while both waited
    assert trace.error.startswith("RunTimeout: timed out after 300 s at step 3")
    assert trace.steps() == [1, 2]
    assert trace.get(2, "loss", "loss") is not None         # both workers' replicas
    assert trace.get(2, "weight", "dense2/kernel") is not None
    assert not any(alive(pid) for pid in trace.meta.details["worker_pids"].values())


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from verify.runners.run import run_implementation

    case = tiny_loop_case()
    out = {}

    def run(name, capture_steps=None):
        key = (name, capture_steps)
        if key not in out:
            out[key] = run_implementation(case, case.implementation(name),
                                          capture_steps=capture_steps,
                                          workdir=tmp_path_factory.mktemp(name))
        return out[key]

    return run


@pytest.mark.slow
def test_two_workers_train_exactly_what_the_order_matched_reference_trains(traces):
    """At 2 workers x 1 replica the all-reduce sums two gradients, as the reference does: the
    joined trace (loss and input from both workers, the rest from the chief) is bitwise the
    reference's at every step."""
    candidate = traces("multi-worker-2x1")
    reference = traces("worker-summed-reference-2x1")
    assert candidate.error is None and reference.error is None
    assert candidate.meta.replicas == 2 and candidate.meta.details["workers"] == 2
    keys = {k for k in reference.values if k.quantity != "metric"}
    assert keys == {k for k in candidate.values if k.quantity != "metric"}
    assert {k.quantity for k in keys} == {"input", "loss", "grad", "weight", "slot"}
    assert max(k.step for k in keys) == 4
    for key in keys:
        assert np.array_equal(candidate.values[key], reference.values[key]), key


@pytest.mark.slow
def test_capture_is_inert_on_multiple_workers(traces):
    captured = traces("multi-worker-2x1")
    plain = traces("multi-worker-2x1", capture_steps=False)
    assert plain.error is None and plain.meta.capture_every == 4
    last = {k: v for k, v in plain.values.items() if k.step == 4 and k.quantity != "metric"}
    assert {k.quantity for k in last} == {"weight", "slot"}
    for key, value in last.items():
        assert np.array_equal(value, captured.values[key]), key


@pytest.mark.slow
def test_forked_workers_train_bitwise_what_fresh_worker_processes_train(traces, tmp_path,
                                                                       monkeypatch):
    """Workers forked from the process that imported TensorFlow once (the default) train the
    numbers fresh processes train, at every key of every step; a mutant run through the same
    forked workers is told apart by the same check (its learning rate x1.01)."""
    from verify.core.case import Mutation
    from verify.runners.fork_server import SWITCH
    from verify.runners.run import run_implementation

    case = tiny_loop_case()
    forked = traces("multi-worker-2x1")
    assert forked.error is None
    assert forked.meta.details["worker_processes"].startswith("forked from a process")
    mutant = run_implementation(case, dataclasses.replace(
        case.implementation("multi-worker-2x1"), mutation=Mutation("learning_rate", 1.01)),
        workdir=tmp_path / "mutant")
    assert mutant.meta.details["worker_processes"].startswith("forked from a process")
    monkeypatch.setenv(SWITCH, "0")
    fresh = run_implementation(case, case.implementation("multi-worker-2x1"),
                               workdir=tmp_path / "fresh")
    assert fresh.error is None and fresh.meta.details["worker_processes"] == "fresh processes"
    assert len(forked.values) > 100 and differing_values(forked, fresh) == []
    assert {k.quantity for k in differing_values(forked, mutant)} >= {"weight", "loss"}


@pytest.mark.slow
def test_a_cluster_given_by_tf_config_runs_one_worker_per_host(tmp_path):
    """Two 'hosts' on loopback, each running the suite with the TF_CONFIG a cluster manager
    would give it and one shared directory: each starts only its own worker, and both end
    with the same trace."""
    cluster = Cluster.loopback(2)
    spec = tmp_path / "spec.json"
    root = Path(__file__).resolve().parents[3]
    source = tmp_path / "tiny_cases.py"   # the tiny case, as a case source the hosts load
    source.write_text(CASE_SOURCE)
    spec.write_text(json.dumps({"sources": [str(source)], "case": "custom_loop",
                                "implementation": "multi-worker-2x1", "steps": 4}))
    hosts = []
    for task in range(2):
        env = {**os.environ, "TF_CONFIG": cluster.tf_config(task),
               multi_worker.SHARED_DIR: str(tmp_path / "shared"),
               "PYTHONPATH": os.pathsep.join((str(root), str(root / "tests"))),
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        hosts.append(subprocess.Popen(
            [sys.executable, "-m", "verify", "run", str(spec), "--out",
             str(tmp_path / f"host-{task}")], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outputs = [host.communicate(timeout=600)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], outputs
    first, second = (Trace.load(tmp_path / f"host-{task}") for task in range(2))
    assert first.meta.details["cluster"] == "TF_CONFIG"
    assert set(first.values) == set(second.values)
    for key, value in first.values.items():
        assert np.array_equal(value, second.values[key]), key
    assert first.steps()[-1] == 4 and first.get(4, "loss", "loss") is not None
    shared = tmp_path / "shared" / "custom_loop" / "multi-worker-2x1"
    assert sorted(p.name for p in shared.glob("worker-*.log")) == ["worker-0.log",
                                                                   "worker-1.log"]


@pytest.mark.slow
def test_a_host_whose_peer_never_starts_fails_within_the_startup_time_naming_it(
        tmp_path, monkeypatch):
    """TF_CONFIG names two workers; only this host's runs. It fails once `startup_timeout`
    passes (TensorFlow itself would wait an hour), naming the silent worker and its address,
    and leaves no process behind."""
    cluster = Cluster.loopback(2)
    monkeypatch.setenv("TF_CONFIG", cluster.tf_config(0))
    monkeypatch.setenv(multi_worker.SHARED_DIR, str(tmp_path / "shared"))
    case = tiny_loop_case()
    started = time.monotonic()
    trace = run_loop(case, MultiWorkerLoop, tmp_path / "run", grace=1.0, startup_timeout=10.0)
    took = time.monotonic() - started
    assert took < 120, took
    assert trace.error.startswith(
        f"WorkersFailed: worker 1 ({cluster.addresses[1]}) never connected within 10 s"), \
        trace.error
    assert "its host has not started this implementation" in trace.error
    assert not any(alive(pid) for pid in trace.meta.details["worker_pids"].values())


@pytest.mark.slow
def test_a_mutation_reaches_the_workers_optimizer(traces, tmp_path):
    """Sensitivity mutants go through the optimizer tap in every worker: the learning rate
    x1.01 leaves step 1's gradients as they were and moves its update."""
    from verify.core.case import Mutation
    from verify.runners.run import run_implementation

    case = tiny_loop_case()
    faithful = traces("multi-worker-2x1")
    mutant = dataclasses.replace(case.implementation("multi-worker-2x1"),
                                 mutation=Mutation("learning_rate", 1.01))
    trace = run_implementation(case, mutant, workdir=tmp_path)
    assert trace.error is None
    assert np.array_equal(trace.get(1, "grad", "dense2/kernel"),
                          faithful.get(1, "grad", "dense2/kernel"))
    moved = np.abs(trace.get(1, "weight", "dense2/kernel") - case.initial_values["dense2/kernel"])
    expected = np.abs(faithful.get(1, "weight", "dense2/kernel")
                      - case.initial_values["dense2/kernel"])
    assert np.allclose(moved, 1.01 * expected, rtol=1e-3, atol=1e-9)


@pytest.mark.slow
def test_a_loopback_port_taken_before_the_worker_binds_it_is_retried(tmp_path, monkeypatch):
    import socket

    from verify.runners.run import run_implementation

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    made = []
    original = Cluster.loopback.__func__

    def loopback(cls, workers):
        cluster = original(cls, workers)
        if not made:     # the first cluster's worker 0 finds its port taken
            port = taken.getsockname()[1]
            cluster = Cluster((f"127.0.0.1:{port}", *cluster.addresses[1:]))
        made.append(cluster)
        return cluster

    monkeypatch.setattr(Cluster, "loopback", classmethod(loopback))
    case = tiny_loop_case()
    try:
        trace = run_implementation(case, case.implementation("multi-worker-2x1"),
                                   workdir=tmp_path)
    finally:
        taken.close()
    assert trace.error is None and len(made) == 2
    assert trace.steps()[-1] == 4


def test_a_worker_finds_this_verify_first_on_its_path():
    """The directory put first on a worker's PYTHONPATH holds this checkout's verify package
    (not the package itself, whose modules would then shadow top-level names)."""
    import verify
    from verify.runners.loop.worker_startup import worker_environment

    first = Path(worker_environment("{}")["PYTHONPATH"].split(os.pathsep)[0])
    assert (first / "verify" / "__init__.py").resolve() == Path(verify.__file__).resolve()
