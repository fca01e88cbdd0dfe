"""The locks and stamp of the comparison kernels' warm-up (`kernel_warmup`): whether one runs,
whether it finished for these very sources, which group of kernels is being compiled, and a
process's first use of a group under that group's lock (`ready`).

Imported by `kernel_warmup` (which holds the locks, and whose `ready` the judge calls); pure
standard library (`kernel_cache` imports numba only when installing).
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

from verify.judge import kernel_cache

WAIT_LIMIT = 300.0   # seconds a first comparison waits for a warm-up before compiling itself
# True in the warm-up process itself, which holds the locks: it never waits for itself
holding = False


def fingerprint() -> str:
    """What numba's cache depends on: where the kernels are and their sources' contents (the
    stamp `kernel_cache` gives their cache), numba's and Python's versions, and
    NUMBA_CACHE_DIR."""
    parts = [sys.version, os.environ.get("NUMBA_CACHE_DIR", ""), str(kernel_cache.HERE)]
    try:
        from importlib.metadata import version
        parts.append(version("numba"))
    except Exception:   # noqa: BLE001 - no numba metadata: the stamp just never matches
        parts.append("?")
    parts.append(kernel_cache.sources_stamp())
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
    ends); `ready` holds the same lock around a process's first use."""
    fd = os.open(group_lock_path(group), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_ready: set[str] = set()   # the groups this process has already asked for


def ready(kind: str, dtype, capped: bool = False, limit: float = WAIT_LIMIT,
          load=None) -> float:
    """Before this process first calls a group's kernels (`group_name`): take the group's lock
    and, holding it, `load()` them (a call of the group's kernels on tiny arrays: numba loads
    them from its cache, or compiles them into it), so that processes needing a group at the
    same time compile it once. Where the warm-up or another process holds the lock, this one
    waits for it, at most `limit` seconds, and then loads what it compiled. The seconds waited.

    >>> ready("abs_max", "complex64") < 1.0   # a group no warm-up compiles: no wait
    True
    """
    group = group_name(kind, dtype, capped)
    if holding or group in _ready:
        return 0.0
    _ready.add(group)
    start = time.monotonic()
    try:
        fd = os.open(group_lock_path(group), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return 0.0        # no writable temp directory: numba loads or compiles them itself
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > limit:
                    break     # compiled beside the lock's holder, as without a lock
                time.sleep(0.05)
        waited = time.monotonic() - start
        if load is not None:
            load()
        return waited
    finally:
        os.close(fd)
