"""Where a trace keeps its values: in memory while they are small, on disk once they are large.

A production table (1M rows x 64 float32 is 256 MB) recorded at several steps would not fit
in memory twice over, once per side. `TraceValues` is the mapping a `Trace` keeps its values
in: an array of at least `spill_bytes` is written to a scratch directory the moment it is
recorded and read back memory-mapped when it is asked for, so the memory a run holds does not
grow with its steps, and a comparison touches one value of each side at a time. Small values
(losses, dense gradients of small models, the digests) stay in memory, as before.

The scratch directory belongs to the mapping and is removed when the mapping is garbage
collected or the interpreter exits. Values read back are read-only arrays.

>>> values = TraceValues(spill_bytes=1024)
>>> values["big"] = np.ones((64, 8), np.float32)          # 2 KiB: written to disk
>>> values["small"] = np.ones(3, np.float32)
>>> values.on_disk(), values["big"].sum(), values["big"].flags.writeable
(1, 2048.0, False)
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Iterator

import numpy as np

# Arrays of at least this many bytes go to disk (PARITY_SPILL_BYTES overrides): 4 MiB keeps
# every value of the small cases in memory and sends a production table's to disk.
SPILL_BYTES = 4 << 20
# Where the scratch directories are made (PARITY_SPILL_DIR overrides the system's temp dir).
SPILL_DIR = "PARITY_SPILL_DIR"


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
    """An array the mapping wrote to its scratch directory as an .npy file."""

    __slots__ = ("path", "nbytes")

    def __init__(self, path: Path, array: np.ndarray):
        try:
            np.save(path, np.ascontiguousarray(array), allow_pickle=False)
        except OSError as e:
            path.unlink(missing_ok=True)
            raise OSError(f"a trace value of {array.nbytes / 2**20:.0f} MiB could not be kept on "
                          f"disk in {path.parent} ({e}): free space there, point "
                          f"{SPILL_DIR} at a disk with room, or raise PARITY_SPILL_BYTES to keep "
                          f"more values in memory") from e
        self.path, self.nbytes = path, array.nbytes

    def load(self) -> np.ndarray:
        return np.asarray(np.load(self.path, mmap_mode="r"))


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
        self.update(dict(items))

    # ---- the mapping ----
    def __getitem__(self, key):
        value = self._items[key]
        return value.load() if isinstance(value, OnDisk) else value

    def __setitem__(self, key, value) -> None:
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
        if isinstance(value, np.ndarray):
            return OnDisk(None, (NpyFile(stem.with_suffix(".npy"), value),))
        ids = NpyFile(stem.with_name(stem.name + "_ids.npy"), np.asarray(value.ids))
        rows = NpyFile(stem.with_name(stem.name + "_rows.npy"), np.asarray(value.rows))
        return OnDisk(type(value), (ids, rows), tuple(value.dense_shape))

    def _directory(self) -> Path:
        if self._dir is None:
            base = os.environ.get(SPILL_DIR, "").strip() or None
            try:
                if base:
                    Path(base).mkdir(parents=True, exist_ok=True)
                self._dir = Path(tempfile.mkdtemp(prefix="parity-trace-", dir=base))
            except OSError as e:
                raise OSError(f"no scratch directory for trace values under "
                              f"{base or tempfile.gettempdir()} ({e}): point {SPILL_DIR} at a "
                              f"writable disk with room") from e
            weakref.finalize(self, shutil.rmtree, str(self._dir), ignore_errors=True)
        return self._dir


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    rows = getattr(value, "rows", None)
    if rows is not None:
        return np.asarray(rows).nbytes + np.asarray(value.ids).nbytes
    return 0
