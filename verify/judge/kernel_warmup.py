"""The compiled comparison kernels made ready before the first comparison needs them (numba).

A fresh install holds no compiled kernels: its first large comparison would wait for numba to
compile them (13.5 s of CPU on a 2-core machine, 0.5 s to load them once cached). A parity
session therefore starts `start_warmup()` as it begins: a background process compiles every
specialization the judge uses into numba's cache (beside the package, or the user's cache when
that is read-only, or NUMBA_CACHE_DIR), a group at a time (`kernel_groups`), while the first
implementations train. A process about to call a group's kernels for the first time (`ready`)
takes that group's lock and, holding it, calls them on tiny arrays: numba loads them from the
cache, or compiles them there when the warm-up has not reached the group yet. Where the
warm-up or another process holds the lock (compiling that group), it waits, then loads what
they compiled: a group is compiled once, not by every process that needs it at the same time
(before, the test command's workers each compiled the same groups beside the warm-up).

The warm-up holds a session lock while it runs and a group's lock while it compiles it (the
system releases them however it ends), and leaves a stamp naming the kernels' sources; a
session whose stamp matches starts none. Without numba nothing starts (the judge says so once
and compares on the numpy path); PARITY_KERNEL_WARMUP=0 starts none. A stamp that matches
while numba's cache was deleted since starts none either: that session's first comparison
compiles, as without a warm-up.

    python -m verify.judge.kernel_warmup     # compile (or load) every kernel now
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from verify.judge import kernel_lock
from verify.judge.kernel_lock import fingerprint, is_warm


def start_warmup() -> subprocess.Popen | None:
    """Compile the kernels in a background process unless they are warm, numba is missing or
    another warm-up of them runs, or PARITY_KERNEL_WARMUP=0; returns the process started.

    Example, as a parity session starts::

        start_warmup()   # None when warm, without numba, or already under way
    """
    if (os.environ.get("PARITY_KERNEL_WARMUP") == "0"
            or importlib.util.find_spec("numba") is None):
        return None
    try:
        if is_warm():
            return None
        fd = os.open(kernel_lock.lock_paths()[0], os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None   # no writable temp directory, or the kernels' sources unreadable:
        #               the first comparison compiles, as without a warm-up
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None   # another session's warm-up of these kernels runs
        # the child inherits the locked descriptor: the lock lasts exactly as long as it does
        # (the package's own sources first on the path: the kernels this process would use)
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        return subprocess.Popen([sys.executable, "-m", "verify.judge.kernel_warmup"],
                                pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": path})
    finally:
        os.close(fd)


def kernel_groups(dtype):
    """(group, compile) for every group of specializations the judge calls on arrays of
    `dtype`, cheapest and most often needed first; each compile calls its kernels as the judge
    does (the same argument types), on tiny arrays."""
    import numpy as np

    from verify.judge import equal_kernel, scan_deferred, scan_kernel, sparse_rows_kernel
    from verify.judge.kernel_cache import readonly

    dtype = np.dtype(dtype)
    ref = np.linspace(-1, 1, 3 * scan_kernel.SUM_BLOCK).astype(dtype)
    cand = ref + dtype.type(1e-7)
    # the scan's arrays read-only, as the judge passes them (`kernel_cache.readonly`); the
    # other kernels' wrappers make them so
    scan_ref, scan_cand = readonly(ref), readonly(cand)
    ids = np.arange(64) % 7
    rows = ref[:64 * 16].reshape(64, 16)
    name = kernel_lock.group_name
    return [
        (name("union_rows", dtype), lambda: sparse_rows_kernel.union_rows(
            ids, rows, ids[::-1].copy(), rows, 1024)),
        (name("summed_rows", dtype), lambda: sparse_rows_kernel.summed_rows(ids, rows)),
        (name("abs_max", dtype), lambda: scan_deferred.abs_max(ref)),
        (name("equal", dtype), lambda: equal_kernel.equal_extremes(ref, ref)),
        (name("scan", dtype), lambda: scan_kernel.scan(scan_cand, scan_ref, 1e-6, 1e-5, False,
                                                       np.inf, np.nan)),
        (name("scan", dtype, capped=True), lambda: capped_scans(scan_cand, scan_ref)),
    ]


def capped_scans(cand, ref) -> None:
    """The capped scan's kernels as `compare_engine.capped_kernel_scan` calls them: after a
    read of the reference for the floor (`scan_kernel.scan`), or in one read
    (`scan_deferred`)."""
    import numpy as np

    from verify.judge import scan_deferred, scan_kernel, scan_screen

    scan_kernel.scan(cand, ref, 1e-6, 1e-5, True, 1e-6, 1e-7)
    scan_screen.screens(1e-6, 1e-5, 1e-6)   # asked from Python too: its own cache entry
    _, _, *summaries = scan_deferred.block_summaries(cand, ref, 1e-6, 1e-5, np.inf, 0.0)
    scan_deferred.scan_summarized(cand, ref, 1e-6, 1e-5, 1e-6, 1e-7, *summaries)


def ready(kind: str, dtype, capped: bool = False) -> float:
    """Before this process first calls a group's kernels: `kernel_lock.ready` with the group's
    own call on tiny arrays as what it loads under the group's lock, so that a group is
    compiled by one process and loaded by the others (the warm-up, another worker, this one).
    The seconds waited for another process's compile.

    >>> ready("abs_max", "float32") >= 0.0   # loaded (or compiled) now, at once the next time
    True
    """
    group = kernel_lock.group_name(kind, dtype, capped)
    return kernel_lock.ready(kind, dtype, capped,
                             load=lambda: dict(kernel_groups(dtype))[group]())


def warm_kernels(dtypes=("float32", "float64")) -> None:
    """Compile (or load from numba's cache) every group for these dtypes, holding each group's
    lock while it compiles (`kernel_lock.compiling`)."""
    for dtype in dtypes:
        for group, compile_group in kernel_groups(dtype):
            with kernel_lock.compiling(group):
                compile_group()


def main() -> None:
    """Every group, float32 first (the dtype of nearly every trace), then the stamp. The
    session lock (the descriptor this process inherited) is held to the end."""
    kernel_lock.holding = True   # the locks this process holds are its own
    warm_kernels()
    stamp = kernel_lock.lock_paths()[1]
    partial = stamp.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(fingerprint())
    partial.replace(stamp)


if __name__ == "__main__":
    main()
