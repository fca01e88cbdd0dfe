"""How the workers of a multi-worker run start (`verify.runners.loop.multi_worker`): the
environment each worker process gets (`worker_environment`, `extend_import_path` in the
worker), the watch that names the workers that never joined the cluster (`StartupWatch`), and
the sign in a worker's log that its loopback port was taken before it bound it
(`port_taken`)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from verify.runners.loop.cluster import Cluster, accepting
from verify.runners.loop.worker_outputs import output_dir

CONNECTED = "connected"    # a worker's file once its cluster formed (`output_dir`)
IMPORT_PATH = "PARITY_IMPORT_PATH"   # the runner's sys.path, appended to a worker's
# What a worker's log says when its port was taken (gRPC's own words).
PORT_TAKEN = ("Could not start gRPC server", "Address already in use",
              "Failed to add port to server")


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


def worker_environment(tf_config: str) -> dict[str, str]:
    """A worker's environment: this one, with its `TF_CONFIG`, this `verify` first on
    `PYTHONPATH`, and this process's import path in `IMPORT_PATH`, which the worker appends to
    its own (so it imports the same case modules, and a directory put on this process's path
    later, such as a case source, cannot hide the standard library from it)."""
    env = dict(os.environ)
    env["TF_CONFIG"] = tf_config
    root = str(Path(__file__).resolve().parents[3])   # the directory holding verify/
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


def port_taken(run_dir: Path, failed: tuple[int, ...]) -> bool:
    """Whether the log of one of the `failed` workers says its port was taken (`PORT_TAKEN`):
    on the loopback, the runner then starts the workers again on other ports."""
    for task in failed:
        try:
            log = (run_dir / f"worker-{task}.log").read_text(errors="replace")
        except OSError:
            continue
        if any(marker in log for marker in PORT_TAKEN):
            return True
    return False
