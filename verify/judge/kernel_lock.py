"""The locks and stamp of the comparison kernels' warm-up (`kernel_warmup`): whether one runs,
whether it finished for these very sources, which group of kernels it is compiling, and the
wait of a process that needs exactly that group (`ready`).

Imported by `compare_engine` and `sparse_rows` (which ask) and `kernel_warmup` (which holds the
locks); pure standard library (`kernel_cache` imports numba only when installing).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from verify.judge.kernel_cache import KERNEL_SOURCES

WAIT_LIMIT = 300.0   # seconds a first comparison waits for a warm-up before compiling itself
# True in the warm-up process itself, which holds the locks: it never waits for itself
holding = False


def fingerprint() -> str:
    """What numba's cache depends on: the kernels' sources (path, size, mtime), numba's and
    Python's versions, and NUMBA_CACHE_DIR."""
    here = Path(__file__).resolve().parent
    parts = [sys.version, os.environ.get("NUMBA_CACHE_DIR", "")]
    try:
        from importlib.metadata import version
        parts.append(version("numba"))
    except Exception:   # noqa: BLE001 - no numba metadata: the stamp just never matches
        parts.append("?")
    for name in KERNEL_SOURCES:
        stat = (here / name).stat()
        parts.append(f"{here / name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def lock_paths() -> tuple[Path, Path]:
    """The lock file and stamp of this install's kernels (per user, per cache location)."""
    key = hashlib.sha256(f"{Path(__file__).resolve().parent}|"
                         f"{os.environ.get('NUMBA_CACHE_DIR', '')}".encode()).hexdigest()[:16]
    base = Path(tempfile.gettempdir()) / f"verify-kernels-{os.getuid()}-{key}"
    return base.with_suffix(".lock"), base.with_suffix(".stamp")


def is_warm() -> bool:
    """Whether a finished warm-up compiled these very sources."""
    stamp = lock_paths()[1]
    try:
        return stamp.read_text() == fingerprint()
    except OSError:
        return False


# The kinds of kernel a group holds; a group is a kind for one dtype (and the scan capped or not)
KINDS = ("union_rows", "summed_rows", "abs_max", "equal", "scan")


def group_name(kind: str, dtype, capped: bool = False) -> str:
    """The one name of a group, for the warm-up that compiles it and the caller that waits.

    >>> group_name("scan", "float32", capped=True)
    'scan-float32-capped'
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; known: {', '.join(KINDS)}")
    return f"{kind}-{dtype}{'-capped' if capped else ''}"


def group_lock_path(group: str) -> Path:
    """The lock the warm-up holds while it compiles one group of specializations."""
    return lock_paths()[0].with_suffix(f".{group}.lock")


@contextmanager
def compiling(group: str):
    """Held by the warm-up while it compiles `group` (a `group_name`; released however it
    ends)."""
    fd = os.open(group_lock_path(group), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_ready: set[str] = set()   # the groups this process has already asked for


def ready(kind: str, dtype, capped: bool = False, limit: float = WAIT_LIMIT) -> float:
    """Before this process first calls a group's kernels (`group_name`): wait while the
    warm-up is compiling exactly that group (then it loads them from numba's cache), at most
    `limit` seconds; otherwise go on at once (numba loads or compiles them itself). The
    seconds waited.

    >>> ready("abs_max", "complex64")   # a group no warm-up compiles
    0.0
    """
    group = group_name(kind, dtype, capped)
    if holding or group in _ready:
        return 0.0
    _ready.add(group)
    start = time.monotonic()
    try:
        fd = os.open(group_lock_path(group), os.O_RDONLY)
    except OSError:
        return 0.0        # never compiled by a warm-up here
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return time.monotonic() - start
            except BlockingIOError:
                if time.monotonic() - start > limit:
                    return time.monotonic() - start
                time.sleep(0.05)
    finally:
        os.close(fd)
