"""Where a trace keeps its values: in memory while they are small, on disk once they are large.

A production table (1M rows x 64 float32 is 256 MB) recorded at several steps would not fit
in memory twice over, once per side. `TraceValues` is the mapping a `Trace` keeps its values
in: an array of at least `spill_bytes` is written to a scratch directory the moment it is
recorded and read back memory-mapped when it is asked for, so the memory a run holds does not
grow with its steps, and a comparison touches one value of each side at a time. Small values
(losses, dense gradients of small models, the digests) stay in memory, as before.

The write itself happens on a background thread, so a run goes on training while a table it
recorded is written: until its file is written the value is read from the array recorded (at
most `WRITE_AHEAD_BYTES` of values wait at a time; a record beyond that waits for the writes
before it). A write that fails (a full disk) fails the next record and `flush()`, which a run
calls before its trace is used, with the reason and what to do.

The scratch directory belongs to the mapping and is removed when the mapping is garbage
collected or the interpreter exits. Values read back are read-only arrays.

>>> values = TraceValues(spill_bytes=1024)
>>> values["big"] = np.ones((64, 8), np.float32)          # 2 KiB: written to disk
>>> values["small"] = np.ones(3, np.float32)
>>> values.flush()                                         # its write is done
>>> values.on_disk(), values["big"].sum(), values["big"].flags.writeable
(1, 512.0, False)
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from verify.core.scratch import SPILL_DIR, make_scratch

# Arrays of at least this many bytes go to disk (PARITY_SPILL_BYTES overrides): 4 MiB keeps
# every value of the small cases in memory and sends a production table's to disk.
SPILL_BYTES = 4 << 20
# Where the scratch directories are made: verify.core.scratch (PARITY_SPILL_DIR overrides the
# system's temp dir).


def spill_bytes_default() -> int:
    text = os.environ.get("PARITY_SPILL_BYTES", "").strip()
    if not text:
        return SPILL_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"PARITY_SPILL_BYTES must be a number of bytes, got {text!r}") from None
    if value < 0:
        raise ValueError(f"PARITY_SPILL_BYTES must be >= 0 bytes, got {value}")
    return value


class NpyFile:
    """An array the mapping writes to its scratch directory as an .npy file, on the writer
    thread (`SpillWriter`); until the file is written, `load()` gives the array recorded."""

    __slots__ = ("path", "nbytes", "_array", "_error", "_done")

    def __init__(self, path: Path, array: np.ndarray, writer: "SpillWriter | None" = None):
        self.path, self.nbytes = path, array.nbytes
        self._array, self._error = np.ascontiguousarray(array), None
        self._done = threading.Event()
        if writer is None:
            self.write()
        else:
            writer.submit(self)
        if self._error is not None:
            raise self._error

    def write(self) -> None:
        try:
            np.save(self.path, self._array, allow_pickle=False)
        except OSError as e:
            self.path.unlink(missing_ok=True)
            self._error = OSError(
                f"a trace value of {self.nbytes / 2**20:.0f} MiB could not be kept on disk in "
                f"{self.path.parent} ({e}): free space there, point {SPILL_DIR} at a disk with "
                f"room, or raise PARITY_SPILL_BYTES to keep more values in memory")
        finally:
            self._array = None   # written (or failed): memory is freed
            self._done.set()

    def wait(self) -> None:
        """Block until the file is written; raise the reason when it could not be."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    def failed(self) -> OSError | None:
        return self._error if self._done.is_set() else None

    def load(self) -> np.ndarray:
        array = self._array
        if array is not None:       # not written yet: the array recorded, read-only
            view = array.view()
            view.flags.writeable = False
            return view
        self.wait()
        return np.asarray(np.load(self.path, mmap_mode="r"))


# At most this many bytes of recorded values wait for the writer at a time.
WRITE_AHEAD_BYTES = 512 << 20


class SpillWriter:
    """One thread that writes the files of every mapping in the process, in the order they
    were recorded, with at most `limit` bytes waiting (a record beyond waits for room)."""

    def __init__(self, limit: int = WRITE_AHEAD_BYTES):
        self.limit, self.waiting = limit, 0
        self._room = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-spill")

    def submit(self, file: NpyFile) -> None:
        with self._room:
            self._room.wait_for(lambda: self.waiting == 0 or
                                self.waiting + file.nbytes <= self.limit)
            self.waiting += file.nbytes
        self._pool.submit(self._write, file)

    def _write(self, file: NpyFile) -> None:
        try:
            file.write()
        finally:
            with self._room:
                self.waiting -= file.nbytes
                self._room.notify_all()


_WRITER: tuple[int, SpillWriter] | None = None
_WRITER_LOCK = threading.Lock()


def spill_writer() -> SpillWriter:
    """The process's writer (a new one in a forked child: the parent's thread is not there)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None or _WRITER[0] != os.getpid():
            _WRITER = (os.getpid(), SpillWriter())
        return _WRITER[1]


class OnDisk:
    """A value kept on disk: its arrays' parts (each with a `load()` that maps it read-only)
    and how to rebuild it (a plain array, or `SparseRows`/`TouchedRows` from ids and rows).
    `owned`: the mapping wrote the parts and removes them with the value."""

    __slots__ = ("kind", "parts", "dense_shape", "owned")

    def __init__(self, kind: type | None, parts: tuple, dense_shape=None, owned: bool = True):
        self.kind, self.parts, self.dense_shape, self.owned = kind, parts, dense_shape, owned

    def load(self):
        arrays = [part.load() for part in self.parts]
        if self.kind is None:
            return arrays[0]
        return self.kind(arrays[0], arrays[1], self.dense_shape)

    def remove(self) -> None:
        if self.owned:   # a mapping still open keeps its data until it is dropped (POSIX)
            for part in self.parts:
                if isinstance(part, NpyFile):
                    part._done.wait()   # (an unlink before the write would leave the file)
                part.path.unlink(missing_ok=True)


class TraceValues(MutableMapping):
    """A trace's values by key, arrays of at least `spill_bytes` kept on disk (see the module
    docstring); `spill_bytes=None` keeps everything in memory."""

    def __init__(self, items=(), spill_bytes: int | None | str = "default"):
        self.spill_bytes = spill_bytes_default() if spill_bytes == "default" else spill_bytes
        self._items: dict[Any, Any] = {}
        self._dir: Path | None = None
        self._written = 0
        self._kept: list[TraceValues] = []   # mappings whose files values are shared from
        self._writes: list[NpyFile] = []     # files under way on the writer thread, or failed
        self.update(dict(items))

    # ---- the mapping ----
    def __getitem__(self, key):
        value = self._items[key]
        return value.load() if isinstance(value, OnDisk) else value

    def __setitem__(self, key, value) -> None:
        self._raise_failed_write()
        old = self._items.get(key)
        self._items[key] = self._maybe_spill(value)
        if isinstance(old, OnDisk):
            old.remove()

    def __delitem__(self, key) -> None:
        old = self._items.pop(key)
        if isinstance(old, OnDisk):
            old.remove()

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def __repr__(self) -> str:
        return f"TraceValues({len(self)} values, {self.on_disk()} on disk)"

    def share(self, other: "TraceValues", key, new_key) -> None:
        """Hold `other`'s value at `key` as this mapping's `new_key` without copying it: a value
        `other` keeps on disk is read from `other`'s file, and `other`'s directory is kept for
        as long as this mapping lives (a trace renamed into canonical names, say)."""
        item = other._items[key]
        self.pop(new_key, None)
        if isinstance(item, OnDisk):
            item = OnDisk(item.kind, item.parts, item.dense_shape, owned=False)
            if not any(kept is other for kept in self._kept):
                self._kept.append(other)
        self._items[new_key] = item

    def flush(self) -> None:
        """Wait until every value recorded is written; raise the first write that failed
        (`OSError`, saying what to do)."""
        for part in self._files():
            part.wait()

    def _files(self) -> Iterator[NpyFile]:
        for item in list(self._items.values()):
            if isinstance(item, OnDisk):
                yield from (p for p in item.parts if isinstance(p, NpyFile))

    def _raise_failed_write(self) -> None:
        for written in self._writes:
            error = written.failed()
            if error is not None:
                raise error

    def on_disk(self) -> int:
        """How many values are kept on disk."""
        return sum(isinstance(v, OnDisk) for v in self._items.values())

    def nbytes(self, key) -> int:
        """The bytes of the arrays of the value at `key`, without reading it from disk."""
        value = self._items[key]
        if isinstance(value, OnDisk):
            return sum(part.nbytes for part in value.parts)
        return _nbytes(value)

    # ---- spilling ----
    def _maybe_spill(self, value):
        if self.spill_bytes is None or isinstance(value, (str, OnDisk)):
            return value
        if _nbytes(value) < self.spill_bytes or np.ndim(getattr(value, "rows", value)) == 0:
            return value   # (a 0-d array would come back as (1,) from np.memmap)
        directory = self._directory()
        self._written += 1
        stem = directory / f"v{self._written}"
        # the files still under way, and those that failed (every later record raises)
        self._writes[:] = [f for f in self._writes if not f._done.is_set() or f.failed()]
        writer = spill_writer()

        def file(suffix, array):
            written = NpyFile(stem.with_name(stem.name + suffix), array, writer)
            self._writes.append(written)
            return written

        if isinstance(value, np.ndarray):
            return OnDisk(None, (file(".npy", value),))
        ids = file("_ids.npy", np.asarray(value.ids))
        rows = file("_rows.npy", np.asarray(value.rows))
        return OnDisk(type(value), (ids, rows), tuple(value.dense_shape))

    def _directory(self) -> Path:
        if self._dir is None:
            base = os.environ.get(SPILL_DIR, "").strip() or None
            try:
                if base:
                    Path(base).mkdir(parents=True, exist_ok=True)
                self._dir = make_scratch("trace", base)
            except OSError as e:
                raise OSError(f"no scratch directory for trace values under "
                              f"{base or tempfile.gettempdir()} ({e}): point {SPILL_DIR} at a "
                              f"writable disk with room") from e
            weakref.finalize(self, _remove_directory, self._dir, self._writes)
        return self._dir


def _remove_directory(directory: Path, writes: list[NpyFile]) -> None:
    for written in writes:      # a write still under way would put its file back
        written._done.wait()
    shutil.rmtree(directory, ignore_errors=True)


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    rows = getattr(value, "rows", None)
    if rows is not None:
        return np.asarray(rows).nbytes + np.asarray(value.ids).nbytes
    return 0
