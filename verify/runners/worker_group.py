"""Worker processes started together and stopped together, none left running.

A multi-worker run starts one process per worker. When one fails, the others wait in a
collective for a peer that will never answer; when the run is interrupted (a time limit, ^C),
nothing else would stop them. `WorkerGroup` owns them: each runs in its own process group
(so anything it starts goes with it) with its output in a log file, `wait()` returns once
every worker exited 0 and stops the others as soon as one fails or the deadline passes, and
leaving the `with` block, however it is left, stops every group still running (SIGTERM or the
workers' own stop signal, then SIGKILL after a grace period) and reaps it. A worker started here also ends itself when this
process dies (`exit_with_parent`, called by the worker), since a killed parent cannot clean up.

>>> import sys
>>> with WorkerGroup(Path(tempfile.mkdtemp())) as group:
...     _ = group.start(0, [sys.executable, "-c", "print('hello')"])
...     group.wait(timeout=60)
>>> group.log_tail(0)
'hello'
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

LOG_LINES = 30        # lines of a worker's log kept in a failure's message
POLL_SECONDS = 0.05
PARENT = "PARITY_WORKER_PARENT"   # the starting process's pid, in a worker's environment


class WorkersFailed(RuntimeError):
    """A worker exited with an error (`failed`: which) or the workers did not finish in time
    (`late`: which were still running); the message names each worker's fate and ends with
    the failing workers' log tails."""

    def __init__(self, message: str, failed: Sequence[int] = (), late: Sequence[int] = ()):
        super().__init__(message)
        self.failed, self.late = tuple(failed), tuple(late)


@dataclasses.dataclass
class Worker:
    index: int
    process: subprocess.Popen   # or a ForkedProcess, which answers alike
    log: Path
    started: float
    stopped_by_group: bool = False   # still running when the group stopped it
    gone: bool = False               # its process group is known to be empty


class WorkerGroup:
    """Processes started with `start()`, watched by `wait()`, stopped on leaving the block.

    A worker is stopped with `stop_signal` (SIGTERM unless the workers listen for another),
    then SIGKILL after `grace` seconds.
    """

    def __init__(self, directory: Path, grace: float = 3.0,
                 stop_signal: int = signal.SIGTERM):
        self.directory, self.grace, self.stop_signal = Path(directory), grace, stop_signal
        self.workers: dict[int, Worker] = {}

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    @property
    def pids(self) -> dict[int, int]:
        return {index: w.process.pid for index, w in self.workers.items()}

    def start(self, index: int, argv: Sequence[str],
              env: Mapping[str, str] | None = None, fork_server=None) -> Worker:
        """Start worker `index` as `argv` in a process group of its own, its stdout and stderr
        going to `<directory>/worker-<index>.log`: forked by `fork_server`
        (`verify.runners.fork_server.ForkServer`) when given and available, else as a fresh
        process."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / f"worker-{index}.log"
        env = {**(env or os.environ), PARENT: str(os.getpid())}
        with open(log, "wb") as out:
            process = fork_server.start(argv, env, log) if fork_server is not None else None
            if process is None:
                process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
        self.workers[index] = Worker(index, process, log, time.monotonic())
        return self.workers[index]

    def wait(self, timeout: float | None,
             check: Callable[[], tuple[str, list[int]] | None] | None = None) -> None:
        """Return when every worker exited with status 0. Raise `WorkersFailed` (after
        stopping the others) as soon as one exits otherwise, when `timeout` seconds pass
        first (None: no limit), or when `check()` (called every poll) returns a headline and
        the workers it blames."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = {i: w.process.poll() for i, w in self.workers.items()}
            failed = [i for i, code in codes.items() if code not in (None, 0)]
            if failed:
                self.stop()
                raise WorkersFailed(self.describe(f"worker {failed[0]} failed"), failed)
            if all(code == 0 for code in codes.values()):
                return
            found = check() if check is not None else None
            if found is not None:
                headline, late = found
                self.stop()
                raise WorkersFailed(self.describe(headline), late=late)
            if deadline is not None and time.monotonic() > deadline:
                running = [i for i, code in codes.items() if code is None]
                self.stop()
                raise WorkersFailed(self.describe(
                    f"the workers did not finish within {timeout:g} s (still running: "
                    f"{', '.join(f'worker {i}' for i in running)})"), late=running)
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """Stop every worker still running, with everything in its process group: the stop
        signal, then SIGKILL after the grace period; reap them all."""
        running = [w for w in self.workers.values() if w.process.poll() is None]
        for worker in running:
            worker.stopped_by_group = True
            _signal_group(worker.process.pid, self.stop_signal)
        deadline = time.monotonic() + self.grace
        for worker in running:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for worker in self.workers.values():
            # The leader may be gone while others in its group (processes it started) live.
            if not worker.gone:
                _signal_group(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
            worker.gone = worker.gone or _group_gone(worker.process.pid, self.grace)

    def describe(self, headline: str) -> str:
        """`headline`, each worker's fate, then the log tails of the workers that failed (or,
        when none did, of every worker)."""
        fates, tails = [], []
        for index, worker in sorted(self.workers.items()):
            code = worker.process.poll()
            seconds = time.monotonic() - worker.started
            if worker.stopped_by_group:
                fate = "stopped by the runner (it was still running)"
            elif code is None:
                fate = "running"
            elif code < 0:
                fate = f"killed by {signal.Signals(-code).name}"
            else:
                fate = f"exited with status {code}"
            fates.append(f"worker {index} (pid {worker.process.pid}): {fate} after "
                         f"{seconds:.1f} s")
            if code not in (0, None) and not worker.stopped_by_group:
                tails.append((index, worker))
        tails = tails or sorted(self.workers.items())
        text = [f"{headline}.", *fates]
        for index, worker in tails:
            text.append(f"--- log of worker {index}, last {LOG_LINES} lines ({worker.log}) ---")
            text.append(self.log_tail(index))
        return "\n".join(text)

    def log_tail(self, index: int, lines: int = LOG_LINES) -> str:
        """The last `lines` lines of worker `index`'s log."""
        try:
            text = self.workers[index].log.read_text(errors="replace")
        except OSError as e:
            return f"(log unreadable: {e})"
        return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_gone(pgid: int, timeout: float) -> bool:
    """Whether process group `pgid` has no process left, waiting up to `timeout` seconds for
    processes already sent SIGKILL to go."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)


def exit_with_parent(poll_seconds: float = 0.5) -> None:
    """In a worker: end this process (and its group) when the process that started it dies,
    so a parent killed with SIGKILL leaves no worker behind (a daemon thread watches; also
    when the parent died before this was called)."""
    parent = int(os.environ.get(PARENT) or os.getppid())

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        if os.getpgrp() == os.getpid():    # a group of its own: end what it started too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
