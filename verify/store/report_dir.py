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
verify.store.report_dir.ReportDirBusy: another parity run is writing into ...
>>> lock.release()
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import tempfile
from pathlib import Path

from verify.core.scratch import pid_alive

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


def check_writable(directory: Path, option: str) -> None:
    """Raise OutputNotWritable when `directory` cannot be created or a file written in it.

    Leaves nothing behind: directories it had to create and the probe file are removed.

    >>> check_writable(Path(tempfile.mkdtemp()) / "new" / "reports", "--report-dir")
    >>> check_writable(Path("/proc/version/reports"), "--report-dir")
    Traceback (most recent call last):
    ...
    verify.store.report_dir.OutputNotWritable: --report-dir /proc/version/reports: cannot create ...
    """
    directory = Path(directory)
    created = [p for p in (directory, *directory.parents) if not p.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".parity-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        named = f"{option}{directory}" if option.endswith("=") else f"{option} {directory}"
        raise OutputNotWritable(
            f"{named}: cannot create or write there ({e.strerror or e}"
            + (f": {e.filename}" if e.filename else "") + "); pass a directory this user can "
            "create and write") from None
    finally:
        for path in created:   # deepest first
            try:
                path.rmdir()
            except OSError:
                pass


# ---- what the report directory says while a run writes it, and after one that did not end ----

MANIFEST = ".parity-report.json"    # the report files the last run wrote (only those are replaced)
IN_PROGRESS = "parity-run-in-progress/1"
REPORT_TABLES = ("drift.csv.gz", "drift.csv", "summary.csv", "losses.csv", "preflight.csv",
                 "layers.csv")


def mark_in_progress(report_dir: Path, run_id: str) -> list[Path]:
    """From the start of a session, the report directory says that a run is writing it: its
    summary.md, report.html and run.json say IN PROGRESS (with the run, its process and how to
    tell a run that died), and the earlier report's tables that the suite wrote (listed in
    its manifest) are removed, so no earlier verdict stands while this run has none. A run
    that ends normally, or interrupted (SIGINT, SIGTERM), replaces them with its report; one
    that is killed leaves them saying it did not finish. Returns what it wrote.

    >>> d = Path(tempfile.mkdtemp())
    >>> _ = mark_in_progress(d, "run-1")
    >>> (d / "summary.md").read_text().splitlines()[0]
    '## Parity: IN PROGRESS'
    >>> unfinished_run(d) is None   # this process is alive: still in progress
    True
    """
    from verify.core.files import write_atomic

    report_dir = Path(report_dir)
    for name in listed_report_files(report_dir):
        if name in REPORT_TABLES and not (report_dir / name).is_symlink():
            (report_dir / name).unlink(missing_ok=True)
    remove_earlier_repros(report_dir)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    host = os.uname().nodename
    state = {"schema": IN_PROGRESS, "run_id": run_id, "verdict": "IN PROGRESS",
             "pid": os.getpid(), "host": host, "started": started}
    text = (f"the parity run {run_id} started {started} (process {os.getpid()} on {host}) is "
            f"writing this report. No verdict stands here until it ends. If no such process "
            f"is running, the run did not finish (it was killed): it has no verdict; run the "
            f"suite again.")
    # summary.md last: the file a CI step or a reader polls first never says IN PROGRESS
    # while report.html or run.json still holds the earlier run's verdict
    files = {"report.html": ("<!doctype html><meta charset='utf-8'><title>Parity: IN PROGRESS"
                             f"</title><h1>Parity: IN PROGRESS</h1><p>{text}</p>\n"),
             "run.json": json.dumps(state, indent=1),
             "summary.md": f"## Parity: IN PROGRESS\n\n{text}\n"}
    written = []
    for name, content in files.items():
        write_atomic(report_dir / name, content)
        written.append(report_dir / name)
    return written


REPRO_FILES = ("repro.py", "values.npz", "repro.json")   # what verify.explain.repro writes


def remove_earlier_repros(report_dir: Path) -> None:
    """Remove the repros an earlier run wrote (`repro/<case>/<pair>/` holding only the files
    the suite writes there, `repro.json` among them), so that `python -m verify repro` never
    runs one this run did not find; anything else under `repro/` is left.

    >>> d = Path(tempfile.mkdtemp()); pair = d / "repro" / "c" / "a--b"; pair.mkdir(parents=True)
    >>> for name in REPRO_FILES: _ = (pair / name).write_text("")
    >>> remove_earlier_repros(d); (d / "repro").exists()
    False
    """
    root = Path(report_dir) / "repro"
    for record in sorted(root.glob("*/*/repro.json")) if root.is_dir() else []:
        folder = record.parent
        if {p.name for p in folder.iterdir()} <= set(REPRO_FILES):
            for name in REPRO_FILES:
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
    for folder in sorted((p for p in root.glob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def record_report_files(report_dir: Path, written: list[Path]) -> None:
    """Remember which files of the report directory the suite wrote (its manifest). A table
    the previous manifest lists and this report did not write again (an older report's
    drift.csv, now drift.csv.gz) is the suite's own and stale: it is removed."""
    from verify.core.files import write_atomic

    report_dir = Path(report_dir)
    names = sorted({Path(p).name for p in written if Path(p).parent == report_dir})
    for name in listed_report_files(report_dir):
        if name in REPORT_TABLES and name not in names and not (report_dir / name).is_symlink():
            (report_dir / name).unlink(missing_ok=True)
    write_atomic(report_dir / MANIFEST, json.dumps({"files": names}, indent=1))


REPORT_FILES = (*REPORT_TABLES, "summary.md", "report.html", "run.json")


def foreign_report_files(report_dir: Path) -> list[str]:
    """The files of `report_dir` that writing a report there would replace though no parity
    run wrote them: present, and neither listed in its manifest nor beside a run record of a
    report written before manifests existed.

    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "summary.md").write_text("my notes")
    >>> foreign_report_files(d)
    ['summary.md']
    >>> record_report_files(d, [d / "summary.md"]); foreign_report_files(d)
    []
    """
    report_dir = Path(report_dir)
    present = [name for name in REPORT_FILES
               if (report_dir / name).exists() or (report_dir / name).is_symlink()]
    if not present:
        return []
    if not (report_dir / MANIFEST).is_file():
        try:
            schema = json.loads((report_dir / "run.json").read_text()).get("schema", "")
        except (OSError, ValueError, AttributeError):
            schema = ""
        if str(schema).startswith("parity-run"):   # (and an unfinished run's IN PROGRESS)
            return []
    listed = set(listed_report_files(report_dir))
    return [name for name in present if name not in listed]


def listed_report_files(report_dir: Path) -> list[str]:
    """The report files the suite's manifest lists ([] without one, or a damaged one)."""
    try:
        doc = json.loads((Path(report_dir) / MANIFEST).read_text())
        return [str(name) for name in doc.get("files", []) if "/" not in str(name)]
    except (OSError, ValueError, AttributeError):
        return []


def unfinished_run(report_dir: Path) -> str | None:
    """Why the report in `report_dir` is not a finished run's: None when it is one (or has no
    run.json at all); else a sentence saying it is in progress or did not finish."""
    try:
        state = json.loads((Path(report_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("schema") != IN_PROGRESS:
        return None
    pid, host = state.get("pid"), state.get("host")
    alive = (host == os.uname().nodename and isinstance(pid, int) and pid_alive(pid))
    if alive and pid == os.getpid():
        return None
    return (f"the run {state.get('run_id')} in {report_dir} "
            + ("is still in progress" if alive else
               f"did not finish (started {state.get('started')}, process {pid} on {host} is "
               f"gone): it has no verdict")
            + "; run the suite again, or compare with a history record")
