"""The report directory as a run owns it: checked writable before anything trains, and locked
while a session writes into it, so two sessions never mix or delete each other's results.

The lock is `<report-dir>/.parity.lock`, held with `flock` by the controlling process for the
whole session and naming its pid and run id. A second session into the same directory is
refused at start; a lock file left by a process that died is taken over (the kernel drops a
dead process's `flock`). Nothing here imports TensorFlow.

>>> import tempfile
>>> lock = ReportLock(Path(tempfile.mkdtemp()))
>>> lock.acquire("run-1")
>>> ReportLock(lock.path.parent).acquire("run-2")
Traceback (most recent call last):
...
verify.report_dir.ReportDirBusy: another parity run is writing into ...
>>> lock.release()
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import tempfile
from pathlib import Path

LOCK = ".parity.lock"


class ReportDirBusy(Exception):
    """Another live session holds the report directory; the message names it."""


class OutputNotWritable(Exception):
    """A directory the session must write into cannot be created or written."""


class ReportLock:
    """An exclusive lock on one report directory, held until `release` (or process exit)."""

    def __init__(self, report_dir: Path):
        self.path = Path(report_dir) / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, run_id: str) -> None:
        """Take the lock for `run_id`; raise ReportDirBusy when a live session holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ReportDirBusy(self._busy_message()) from None
            if self._is_current(fd):
                break
            os.close(fd)   # released and removed while we opened it: lock the new file
        holder = {"pid": os.getpid(), "run_id": run_id,
                  "started": datetime.datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (a no-op when not held)."""
        if self._fd is None:
            return
        if self._is_current(self._fd):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _busy_message(self) -> str:
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):
            holder = {}
        return (f"another parity run is writing into {self.path.parent} (pid "
                f"{holder.get('pid', '?')}, run {holder.get('run_id', '?')}, started "
                f"{holder.get('started', '?')}); wait for it to finish, or pass another "
                f"--report-dir so that neither run loses results")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this machine).

    >>> pid_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # it exists, owned by someone else
    return True


def check_writable(directory: Path, option: str) -> None:
    """Raise OutputNotWritable when `directory` cannot be created or a file written in it.

    Leaves nothing behind: directories it had to create and the probe file are removed.

    >>> check_writable(Path(tempfile.mkdtemp()) / "new" / "reports", "--report-dir")
    >>> check_writable(Path("/proc/version/reports"), "--report-dir")
    Traceback (most recent call last):
    ...
    verify.report_dir.OutputNotWritable: --report-dir /proc/version/reports: cannot create ...
    """
    directory = Path(directory)
    created = [p for p in (directory, *directory.parents) if not p.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".parity-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputNotWritable(
            f"{option} {directory}: cannot create or write there ({e.strerror or e}"
            + (f": {e.filename}" if e.filename else "") + "); pass a directory this user can "
            "create and write") from None
    finally:
        for path in created:   # deepest first
            try:
                path.rmdir()
            except OSError:
                pass
