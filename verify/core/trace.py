"""What one run of one implementation produced, step by step, in canonical names.

A `Trace` is plain data (numpy arrays, strings, dicts): it never holds a TensorFlow object, so
a trace written on a TPU VM can be loaded and compared anywhere.

Step numbering: step 0 holds the variables as loaded, before any update. Step k (k >= 1) holds
what the k-th training step consumed and produced: its input digests, its loss and gradients
(computed before the update) and the slots and weights after the update.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from verify.core.files import write_atomic
from verify.core.meta import TraceMeta
from verify.core.quantities import NAMES, check_quantity

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

    def to_dense(self) -> np.ndarray:
        dense = np.zeros(self.dense_shape, dtype=self.rows.dtype)
        np.add.at(dense, self.ids.astype(np.int64), self.rows)
        return dense


Value = np.ndarray | SparseRows | str


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
    values: dict[Key, Value] = dataclasses.field(default_factory=dict)
    # Set when the run raised: the trace then carries what was captured before the error.
    error: str | None = None

    def __post_init__(self):
        if not isinstance(self.meta, TraceMeta):   # a plain dict: facts by name
            self.meta = TraceMeta.from_dict(self.meta)
        if not self.meta.implementation:
            self.meta.implementation = self.implementation

    def record(self, step: int, quantity: str, tensor: str, value: Any) -> None:
        if isinstance(value, (SparseRows, str)):
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

    def save(self, path: str | os.PathLike) -> Path:
        """Write `<path>.npz` and `<path>.json` atomically; return the json path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        index: dict[str, Any] = {}
        for n, (key, value) in enumerate(self.values.items()):
            name = key.encode()
            if isinstance(value, str):
                index[name] = {"kind": "str", "value": value}
            elif isinstance(value, SparseRows):
                arrays[f"a{n}_ids"], arrays[f"a{n}_rows"] = value.ids, value.rows
                index[name] = {"kind": "sparse", "slot": n, "dense_shape": list(value.dense_shape)}
            else:
                arrays[f"a{n}"] = value
                index[name] = {"kind": "dense", "slot": n}
        doc = {"implementation": self.implementation, "meta": self.meta.to_dict(), "error": self.error,
               "index": index}
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        write_atomic(path.with_suffix(".npz"), buffer.getvalue())
        write_atomic(path.with_suffix(".json"), json.dumps(doc, indent=1, default=str))
        return path.with_suffix(".json")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        path = Path(path)
        doc = json.loads(path.with_suffix(".json").read_text())
        with np.load(path.with_suffix(".npz")) as arrays:
            trace = cls(doc["implementation"], TraceMeta.from_dict(doc["meta"]),
                        error=doc.get("error"))
            for name, entry in doc["index"].items():
                key = Key.decode(name)
                if entry["kind"] == "str":
                    trace.values[key] = entry["value"]
                elif entry["kind"] == "sparse":
                    n = entry["slot"]
                    trace.values[key] = SparseRows(arrays[f"a{n}_ids"], arrays[f"a{n}_rows"],
                                                   tuple(entry["dense_shape"]))
                else:
                    trace.values[key] = arrays[f"a{entry['slot']}"]
        return trace


def digest_batch(batch: Mapping[str, Any]) -> dict[str, str]:
    """Digest every feature of a batch.

    Values are cast to a canonical dtype first (float32, int64) so that two implementations
    feeding the same numbers with different integer widths agree. A sparse feature digests its
    batch size and its (example, id) pairs: the padded width and the column positions are
    layout, not data, and differ legitimately between input pipelines.
    """
    out = {}
    for name, value in batch.items():
        if hasattr(value, "indices") and hasattr(value, "values"):
            rows = np.asarray(value.indices, np.int64).reshape(-1, 2)[:, 0]
            ids = np.asarray(value.values, np.int64).ravel()
            batch_size = np.asarray(value.dense_shape, np.int64).ravel()[:1]
            out[name] = digest(np.concatenate([batch_size, rows, ids]))
        else:
            array = np.asarray(value)
            canonical = np.float32 if array.dtype.kind == "f" else np.int64
            out[name] = digest(array.astype(canonical))
    return out
