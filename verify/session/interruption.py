"""How a parity session stops when it is cancelled: SIGINT and SIGTERM handled as Ctrl-C,
the first one writing the report so far, and the session's child processes told to stop; and
how a command's output files are written whole through a cancel (`writes_whole`)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path


class Interruption:
    """How a session stops on SIGINT or SIGTERM (how CI systems cancel a job: GitHub sends
    SIGINT, then SIGTERM 7.5 s later, then SIGKILL; GitLab, Jenkins and Kubernetes send SIGTERM
    first). Either signal ends the session as Ctrl-C does (KeyboardInterrupt). In the
    controlling process the first one also writes the INCOMPLETE report of the pairs judged
    so far at once, before pytest waits for its xdist workers, so a job killed soon after still
    leaves a report; later signals are noted but do not interrupt the writing of the final
    report.
    """

    def __init__(self):
        self.first: str = ""
        self.on_first = None      # the controller's early report, set once it exists
        self.holding = False      # the final report is being written: signals are noted only
        self.held: str = ""       # the signal that arrived meanwhile

    def hold(self) -> None:
        """From now on (the final report is being written, every test has ended) a signal is
        noted in `held` and does not interrupt: the report is written whole, and the session
        then ends saying so."""
        self.holding = True

    def install(self) -> None:
        """Handle SIGINT and SIGTERM in this process, unless someone else already does (a
        SIGINT ignored by a background job stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self.handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self.handle)

    def uninstall(self) -> None:
        for signum, default in ((signal.SIGTERM, signal.SIG_DFL),
                                (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(signum) == self.handle:
                signal.signal(signum, default)

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.holding:
            self.held = self.held or name
            return
        if self.first:   # already stopping: let the report be written
            return
        self.first = name
        if self.on_first is not None:
            try:
                self.on_first(name)
            except Exception:  # noqa: BLE001 - the final report is still written at the end
                pass
        raise KeyboardInterrupt(f"stopped by {name}")


def stop_children() -> None:
    """SIGTERM to this process's children (pytest-xdist's workers, environment processes), so
    that a cancelled session ends in seconds instead of waiting for the runs under way; each
    of them stops as the session does (an interrupted pair is reported as not run)."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:    # the parent pid
            try:
                os.kill(int(stat.parent.name), signal.SIGTERM)
            except OSError:
                pass


@contextlib.contextmanager
def writes_whole():
    """Hold SIGINT and SIGTERM while a command writes its output files, then end as they ask
    (KeyboardInterrupt): ^C never leaves a report or calibration half-written. Signals that are
    ignored (a background job's SIGINT) stay ignored; outside the main thread, nothing is held.

    >>> with writes_whole():
    ...     pass
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(signum, lambda number, frame: held.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler not in (signal.SIG_IGN, None):
                signal.signal(signum, handler)
    if held:
        raise KeyboardInterrupt(f"stopped by {signal.Signals(held[0]).name}")
