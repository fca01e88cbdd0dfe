"""What one run of one implementation produced, step by step, in canonical names.

A `Trace` is plain data (numpy arrays, strings, dicts): it never holds a TensorFlow object, so
a trace written on a TPU VM can be loaded and compared anywhere.

Step numbering: step 0 holds the variables as loaded, before any update. Step k (k >= 1) holds
what the k-th training step consumed and produced: its input (per example, in the canonical
form of `verify.core.inputs`), its loss and gradients (computed before the update) and the
slots and weights after the update.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from verify.core.files import BadFile, read_json, write_atomic
from verify.core.inputs import InputFeature, input_batch
from verify.core.meta import TraceMeta
from verify.core.npz_files import (READ_ERRORS, DigestMismatch, MappedMember, NpzMembers,
                                   write_npz)
from verify.core.quantities import NAMES, check_quantity
from verify.core.trace_values import OnDisk, TraceValues

# Order in which quantities are checked within one step (see verify.core.quantities).
QUANTITIES = NAMES


@dataclasses.dataclass(frozen=True)
class SparseRows:
    """Rows of a table touched in one step, as `tf.IndexedSlices` carries them.

    `ids` may repeat (one entry per lookup); `to_dense` sums repeated rows, as the optimizer does.

    >>> g = SparseRows(np.array([0, 2, 0]), np.ones((3, 2), np.float32), (4, 2))
    >>> g.to_dense()[0].tolist()
    [2.0, 2.0]
    """

    ids: np.ndarray
    rows: np.ndarray
    dense_shape: tuple[int, ...]

    def __post_init__(self):
        # Shapes often arrive as numpy integers (from TF); keep plain ints so they compare and
        # serialize as numbers.
        object.__setattr__(self, "dense_shape", tuple(int(d) for d in self.dense_shape))

    def problem(self) -> str:
        """Why these rows are not a slice of a table of `dense_shape` ('' when they are): ids
        that are not integers, rows of another shape, or ids outside the table (numpy would
        wrap a negative id around silently).

        >>> SparseRows(np.array([-1, 4, 2]), np.ones((3, 2)), (4, 2)).problem()
        'row ids [-1, 4] are out of range for a table of 4 rows (ids 0 to 3)'
        """
        ids, rows = np.asarray(self.ids), np.asarray(self.rows)
        if not self.dense_shape:
            return "rows of a table without a shape"
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            return f"row ids must be a 1-D integer array, got {ids.dtype} of shape {ids.shape}"
        if rows.shape != (len(ids), *self.dense_shape[1:]):
            return (f"rows of shape {rows.shape} do not hold {len(ids)} rows of a table of "
                    f"shape {self.dense_shape}")
        size = self.dense_shape[0]
        outside = np.unique(ids[(ids < 0) | (ids >= size)])
        if not outside.size:
            return ""
        listed = ", ".join(str(i) for i in outside[:10].tolist()) + (
            f" and {outside.size - 10} more" if outside.size > 10 else "")
        return (f"row ids [{listed}] are out of range for a table of {size} rows (ids 0 to "
                f"{size - 1})")

    def to_dense(self) -> np.ndarray:
        """The dense gradient: rows summed into their ids. A ValueError when `problem()`."""
        problem = self.problem()
        if problem:
            raise ValueError(f"sparse rows cannot be made dense: {problem}")
        dense = np.zeros(self.dense_shape, dtype=self.rows.dtype)
        np.add.at(dense, self.ids.astype(np.int64), self.rows)
        return dense


@dataclasses.dataclass(frozen=True)
class TouchedRows:
    """Some rows of a table (or of a table's optimizer slot) after one step: the rows the
    step's update touched, by distinct sorted id, with their values after the update. The
    other rows are those of the last whole table recorded, updated by the touched rows of
    later steps (`verify.judge.touched_rows`).

    >>> t = TouchedRows(np.array([1, 5]), np.zeros((2, 3), np.float32), (8, 3))
    >>> t.ids.tolist(), t.rows.shape, t.dense_shape
    ([1, 5], (2, 3), (8, 3))
    """

    ids: np.ndarray
    rows: np.ndarray
    dense_shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "dense_shape", tuple(int(d) for d in self.dense_shape))
        object.__setattr__(self, "ids", np.asarray(self.ids, np.int64).reshape(-1))


Value = np.ndarray | SparseRows | TouchedRows | InputFeature | str


def as_dense(value: np.ndarray | SparseRows) -> np.ndarray:
    return value.to_dense() if isinstance(value, SparseRows) else np.asarray(value)


def digest(array: np.ndarray) -> str:
    """Stable short digest of an array's dtype, shape and bytes.

    >>> digest(np.arange(3, dtype=np.int64)) == digest(np.arange(3, dtype=np.int64))
    True
    """
    array = np.ascontiguousarray(array)
    h = hashlib.sha256()
    h.update(f"{array.dtype.str}|{array.shape}|".encode())
    h.update(array.tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Key:
    step: int
    quantity: str
    tensor: str

    def __post_init__(self):
        check_quantity(self.quantity)

    def encode(self) -> str:
        return f"{self.step}|{self.quantity}|{self.tensor}"

    @classmethod
    def decode(cls, text: str) -> "Key":
        step, quantity, tensor = text.split("|", 2)
        return cls(int(step), quantity, tensor)


@dataclasses.dataclass
class Trace:
    """Per-step values of one run, keyed by (step, quantity, canonical tensor name).

    >>> t = Trace("tf2", TraceMeta(replicas=1))
    >>> t.record(1, "loss", "loss", np.float32(0.25))
    >>> t.get(1, "loss", "loss")
    array(0.25, dtype=float32)
    >>> t.steps()
    [1]
    """

    implementation: str
    meta: TraceMeta = dataclasses.field(default_factory=TraceMeta)
    # large arrays are kept on disk from the moment they are recorded (see TraceValues)
    values: TraceValues = dataclasses.field(default_factory=TraceValues)
    # Set when the run raised: the trace then carries what was captured before the error.
    error: str | None = None

    def __post_init__(self):
        if not isinstance(self.meta, TraceMeta):   # a plain dict: facts by name
            self.meta = TraceMeta.from_dict(self.meta)
        if not isinstance(self.values, TraceValues):
            self.values = TraceValues(self.values)
        if not self.meta.implementation:
            self.meta.implementation = self.implementation

    def record(self, step: int, quantity: str, tensor: str, value: Any) -> None:
        if isinstance(value, (SparseRows, TouchedRows, InputFeature, str)):
            self.values[Key(step, quantity, tensor)] = value
        else:
            self.values[Key(step, quantity, tensor)] = np.asarray(value)

    def get(self, step: int, quantity: str, tensor: str) -> Value | None:
        return self.values.get(Key(step, quantity, tensor))

    def steps(self) -> list[int]:
        return sorted({k.step for k in self.values if k.step > 0})

    def keys_at(self, step: int) -> Iterator[Key]:
        return (k for k in self.values if k.step == step)

    # ---- persistence: one .npz of arrays + one .json of strings, metadata and the index ----

    def save(self, path: str | os.PathLike, compress: bool = True) -> Path:
        """Write `<path>.npz` and `<path>.json` atomically; return the json path.
        `compress=False` skips compression (a trace handed between processes on one machine;
        its large arrays are then memory-mapped when it is loaded).

        The arrays are written one at a time, so saving a trace of production tables holds
        one of them in memory at most. The json records the sha256 of the npz, so a load
        notices an npz that is not the one saved with it (replaced, cut short, or from
        another save)."""
        self.values.flush()   # a value that could not be kept fails the save, not the file
        json_path, npz_path = trace_files(path)
        index: dict[str, Any] = {}

        def arrays():
            for n, key in enumerate(list(self.values)):
                value, name = self.values[key], key.encode()
                if isinstance(value, str):
                    index[name] = {"kind": "str", "value": value}
                elif isinstance(value, InputFeature):
                    parts = value.arrays()
                    index[name] = {"kind": "input", "slot": n, "layout": value.layout,
                                   "parts": list(parts)}
                    for part, array in parts.items():
                        yield f"a{n}_{part}", array
                elif isinstance(value, (SparseRows, TouchedRows)):
                    kind = "sparse" if isinstance(value, SparseRows) else "touched"
                    index[name] = {"kind": kind, "slot": n,
                                   "dense_shape": list(value.dense_shape)}
                    yield f"a{n}_ids", value.ids
                    yield f"a{n}_rows", value.rows
                else:
                    index[name] = {"kind": "dense", "slot": n}
                    yield f"a{n}", value

        sha256 = write_npz(npz_path, arrays(), compress)
        doc = {"implementation": self.implementation, "meta": self.meta.to_dict(),
               "error": self.error, "npz_sha256": sha256, "index": index}
        write_atomic(json_path, json.dumps(doc, indent=1, default=str))
        return json_path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """The trace saved at `path` (its .json, its .npz or their common stem).

        Arrays are not read into memory: stored uncompressed, those of at least MAP_BYTES are
        memory-mapped from the npz when asked for; compressed, they are read one at a time and
        the large ones kept on disk (TraceValues).

        Raises `BadFile` naming the file when either file is missing, cut short, malformed
        or not the one saved with the other."""
        json_path, npz_path = trace_files(path)
        doc = read_json(json_path, RESAVE)
        _check_index(json_path, doc)
        try:
            meta = TraceMeta.from_dict(doc["meta"])
        except (TypeError, ValueError) as e:
            raise BadFile(json_path, f"its 'meta' is not a trace's meta ({e})", RESAVE) from None
        trace = cls(doc["implementation"], meta, error=doc.get("error"))
        arrays = _read_npz(npz_path, doc.get("npz_sha256"), json_path.name,
                           None if trace.values.spill_bytes is None
                           else min(trace.values.spill_bytes, MAP_BYTES))
        try:
            for name, entry in doc["index"].items():
                trace.values[_index_key(json_path, name)] = _stored_value(
                    json_path, npz_path, name, entry, arrays)
        except BadFile:
            raise
        except READ_ERRORS as e:
            raise BadFile(npz_path, f"not a readable npz, truncated or corrupt "
                                    f"({type(e).__name__}: {e})", RESAVE) from None
        finally:
            arrays.close()
        return trace


# A loaded trace leaves arrays of at least this size stored uncompressed in its npz, mapped on
# each read: a hundred steps of touched rows would otherwise be read into memory whole.
MAP_BYTES = 16 << 10

RESAVE = ("write the trace again (`pytest verify/ --keep-traces`, or `python -m verify run`): "
          "its .json and .npz are written together and belong together")


def trace_files(path: str | os.PathLike) -> tuple[Path, Path]:
    """The .json and .npz of a trace, from either file or their common stem.

    >>> [p.name for p in trace_files("traces/tiny/tf2.5")]
    ['tf2.5.json', 'tf2.5.npz']
    >>> [p.name for p in trace_files("traces/tiny/tf2.npz")]
    ['tf2.json', 'tf2.npz']
    """
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".json", ".npz") else path
    return stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".npz")


def _check_index(json_path: Path, doc: Any) -> None:
    """`BadFile` unless `doc` has the fields of a saved trace's json, with their types."""
    if not isinstance(doc, dict):
        raise BadFile(json_path, "not a trace's json (not a JSON object)", RESAVE)
    expected = {"implementation": str, "meta": dict, "index": dict}
    for field, kind in expected.items():
        if not isinstance(doc.get(field), kind):
            raise BadFile(json_path, f"not a trace's json: its {field!r} is not a "
                                     f"{kind.__name__} (got {type(doc.get(field)).__name__})",
                          RESAVE)
    if not (doc.get("error") is None or isinstance(doc["error"], str)):
        raise BadFile(json_path, "not a trace's json: its 'error' is not text", RESAVE)


def _read_npz(npz_path: Path, sha256: str | None, json_name: str,
              map_bytes: int | None) -> NpzMembers:
    """A trace's npz, checked against the digest its json recorded; its arrays are read when
    asked for (large uncompressed ones memory-mapped)."""
    if not npz_path.exists():
        raise BadFile(npz_path, f"no such file (the arrays of {json_name})", RESAVE)
    try:
        return NpzMembers(npz_path, sha256, map_bytes)
    except DigestMismatch:
        raise BadFile(npz_path, f"not the one {json_name} was saved with (its sha256 differs): "
                                f"it was replaced, cut short or written by another save",
                      RESAVE) from None
    except OSError as e:
        raise BadFile(npz_path, f"cannot be read ({e})", RESAVE) from None
    except READ_ERRORS as e:
        raise BadFile(npz_path, f"not a readable npz, truncated or corrupt "
                                f"({type(e).__name__}: {e})", RESAVE) from None


def _index_key(json_path: Path, name: str) -> Key:
    try:
        return Key.decode(name)
    except ValueError as e:
        raise BadFile(json_path, f"index entry {name!r} is not 'step|quantity|tensor' ({e})",
                      RESAVE) from None


def _stored_value(json_path: Path, npz_path: Path, name: str, entry: Any,
                  arrays: NpzMembers) -> Value | OnDisk:
    """The value an index entry names: its string, its arrays from the npz, or a handle to
    them in the npz (`OnDisk`) when all are stored uncompressed and large."""
    kind = entry.get("kind") if isinstance(entry, dict) else None
    if kind == "str" and isinstance(entry.get("value"), str):
        return entry["value"]
    if kind == "input" and isinstance(entry.get("slot"), int):
        stored = {p: f"a{entry['slot']}_{p}" for p in ("digests", "lengths", "values")}
        parts = {p: arrays[a] for p, a in stored.items() if a in arrays}
        if not {"digests", "lengths"} <= set(parts):
            raise BadFile(json_path, f"index entry {name!r} is not a stored input: {entry!r}",
                          RESAVE)
        return InputFeature.from_arrays(parts, str(entry.get("layout", "")))
    if kind not in ("dense", "sparse", "touched") or not isinstance(entry.get("slot"), int):
        raise BadFile(json_path, f"index entry {name!r} is not a stored value: {entry!r}",
                      RESAVE)
    n = entry["slot"]
    wanted = [f"a{n}"] if kind == "dense" else [f"a{n}_ids", f"a{n}_rows"]
    missing = [array for array in wanted if array not in arrays]
    if missing:
        raise BadFile(npz_path, f"holds no array {', '.join(missing)}, which {json_path.name} "
                                f"stores {name!r} in", RESAVE)
    shape = entry.get("dense_shape")
    if kind != "dense" and not (isinstance(shape, list)
                                and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise BadFile(json_path, f"index entry {name!r} has no valid dense_shape: {shape!r}",
                      RESAVE)
    kind_of = {"dense": None, "sparse": SparseRows, "touched": TouchedRows}[kind]
    # large uncompressed arrays stay in the npz, mapped at each read; others are read now
    parts = [arrays.locate(a) if arrays.mapped(a) else arrays[a] for a in wanted]
    if all(isinstance(part, MappedMember) for part in parts):
        return OnDisk(kind_of, tuple(parts), None if shape is None else tuple(shape),
                      owned=False)
    loaded = [part.load() if isinstance(part, MappedMember) else part for part in parts]
    return loaded[0] if kind_of is None else kind_of(loaded[0], loaded[1], tuple(shape))


def digest_batch(batch: Mapping[str, Any]) -> dict[str, InputFeature]:
    """Every feature of a batch in the canonical per-example form a trace keeps as `input`
    (`verify.core.inputs`): the same examples laid out differently (label (8,) or (8, 1), ids
    int32 or int64, sparse, ragged or masked) give equal per-example digests."""
    return input_batch(batch)
