"""Scratch directories the suite makes, named so that those of a dead run can be found.

A run writes work files into temporary directories (a run's checkpoints, trace values spilled
to disk, the environment workers' files). A run that is killed (SIGKILL, an OOM kill, a CI
job's hard stop) never removes them: a `--full` trace spills 1.7 GB. Each directory is named
`parity-<pid>-<kind>-<random>`; at the start of a session `remove_stale` removes those whose
process is gone, and nothing else (directories of live processes, of other users' files, or
named otherwise stay). Nothing here imports TensorFlow.

>>> import tempfile
>>> base = Path(tempfile.mkdtemp())
>>> mine = make_scratch("trace", base)
>>> mine.name.startswith(f"parity-{os.getpid()}-trace-")
True
>>> (base / "parity-999999999-trace-x").mkdir()   # no such process
>>> [p.name for p in remove_stale([base])]
['parity-999999999-trace-x']
>>> mine.is_dir()
True
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

SPILL_DIR = "PARITY_SPILL_DIR"   # where trace values spill to disk (default: the temp dir)
_NAME = re.compile(r"^parity-(\d+)-[A-Za-z0-9_.]+-")


def make_scratch(kind: str, base: str | Path | None = None) -> Path:
    """A new directory `parity-<pid>-<kind>-<random>` under `base` (default the system's
    temporary directory)."""
    kind = re.sub(r"[^A-Za-z0-9_.]", "_", kind)[:40] or "run"
    return Path(tempfile.mkdtemp(prefix=f"parity-{os.getpid()}-{kind}-", dir=base))


@contextlib.contextmanager
def scratch_directory(kind: str) -> Iterator[Path]:
    """A `make_scratch` directory, removed when the block ends."""
    directory = make_scratch(kind)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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


def scratch_bases() -> list[Path]:
    """Where scratch directories are made: the temp directory and `PARITY_SPILL_DIR`."""
    bases = [Path(tempfile.gettempdir())]
    spill = os.environ.get(SPILL_DIR, "").strip()
    if spill:
        bases.append(Path(spill))
    return bases


def remove_stale(bases: Iterable[Path] | None = None) -> list[Path]:
    """Remove the scratch directories of processes that are gone; return them. Symlinks and
    files are never followed or removed."""

    removed = []
    for base in bases if bases is not None else scratch_bases():
        try:
            entries = list(Path(base).iterdir())
        except OSError:
            continue
        for entry in entries:
            found = _NAME.match(entry.name)
            if (found is None or entry.is_symlink() or not entry.is_dir()
                    or pid_alive(int(found.group(1)))):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
