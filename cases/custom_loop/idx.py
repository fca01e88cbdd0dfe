"""The IDX file format of MNIST and Fashion-MNIST (`train-images-idx3-ubyte.gz` and friends).

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions),
one big-endian uint32 per dimension, then the values in big-endian C order. Files ending in
`.gz` are gzip-compressed.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "labels-idx1-ubyte.gz"
>>> write_idx(path, np.array([3, 1, 4], np.uint8))
>>> read_idx(path).tolist()
[3, 1, 4]
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

# Type code -> big-endian dtype, as the format defines them.
IDX_TYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
             0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class IdxFormatError(ValueError):
    """The file is not a well-formed IDX file."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzip-compressed when its name ends in `.gz`) into a native-endian array.

    Raises `IdxFormatError` saying what is wrong when the header or the size does not fit.
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise IdxFormatError(f"{path}: not an IDX file (the magic number must start with two "
                             f"zero bytes, got {data[:4].hex() or 'an empty file'})")
    code, ndim = data[2], data[3]
    if code not in IDX_TYPES:
        raise IdxFormatError(f"{path}: unknown IDX type code 0x{code:02x}; known: "
                             f"{', '.join(f'0x{c:02x}' for c in IDX_TYPES)}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(f"{path}: header declares {ndim} dimensions but the file ends "
                             f"after {len(data)} bytes")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_TYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise IdxFormatError(f"{path}: shape {shape} of {dtype.name} needs {expected} bytes of "
                             f"values, the file has {len(data) - header}")
    values = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return values.astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write `array` as an IDX file (gzip-compressed when the name ends in `.gz`)."""
    array = np.asarray(array)
    codes = {dtype.newbyteorder("="): code for code, dtype in IDX_TYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise IdxFormatError(f"IDX cannot hold {array.dtype}; use one of "
                             f"{sorted(d.name for d in codes)}")
    big_endian = IDX_TYPES[codes[native]]
    payload = (bytes([0, 0, codes[native], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
               + np.ascontiguousarray(array, dtype=big_endian).tobytes())
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(payload)
