"""The .npz a trace's arrays live in, written and read one array at a time.

`np.savez` wants every array at once and `np.load` of an npz reads a member whole; a trace of
production tables is larger than the memory it may use. `write_npz` streams arrays one by one
into a file written atomically and returns its sha256; `NpzMembers` checks that digest in
blocks, then gives each member when asked: an array stored uncompressed of at least
`map_bytes` comes back memory-mapped from the file (nothing read until touched), any other is
read whole (one member at a time).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "t.npz"
>>> digest = write_npz(path, [("a", np.arange(6.0).reshape(2, 3))], compress=False)
>>> members = NpzMembers(path, digest, map_bytes=0)
>>> members["a"].tolist(), members.mapped("a")
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], True)
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np

BLOCK = 1 << 20   # bytes read at a time to digest a file


def write_npz(path: Path, arrays: Iterable[tuple[str, np.ndarray]], compress: bool) -> str:
    """Write `(name, array)` pairs as an .npz at `path`, atomically (readers see the old file
    or the whole new one), taking each array only when it is written; its sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
            with zipfile.ZipFile(f, "w", compression=method, allowZip64=True) as zf:
                for name, array in arrays:
                    with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
        digest = file_sha256(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return digest
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


class NpzMembers:
    """The arrays of an .npz by name (without `.npy`), read on demand (module docstring).

    Raises `OSError`/`ValueError`/`zipfile.BadZipFile` as reading the file does; a digest
    that differs raises `DigestMismatch` before any member is read."""

    def __init__(self, path: Path, sha256: str | None, map_bytes: int | None):
        self.path, self.map_bytes = Path(path), map_bytes
        self._open = None
        if sha256 is not None and file_sha256(self.path) != sha256:
            raise DigestMismatch(self.path)
        # one open archive for every member read whole (opening it again per member would
        # parse its whole directory each time: minutes for a trace of thousands of values)
        self._zip = zipfile.ZipFile(self.path)
        self.infos = {info.filename[:-4]: info for info in self._zip.infolist()
                      if info.filename.endswith(".npy")}

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def mapped(self, name: str) -> bool:
        """Whether `name` is given memory-mapped (stored uncompressed and large enough)."""
        info = self.infos[name]
        return (self.map_bytes is not None and info.compress_type == zipfile.ZIP_STORED
                and info.file_size >= self.map_bytes)

    def __getitem__(self, name: str) -> np.ndarray:
        if self.mapped(name):
            return self.locate(name).load()
        with self._zip.open(self.infos[name]) as member:
            return np.lib.format.read_array(member, allow_pickle=False)

    def close(self) -> None:
        """Close the archive (members already handed out as mapped stay readable)."""
        self._zip.close()

    def locate(self, name: str) -> "MappedMember":
        """Where an uncompressed member's data lies in the file, to map it when needed."""
        info = self.infos[name]
        if self._open is None:   # one descriptor per file, shared by its mapped members
            self._open = OpenFile(self.path)
        f = self._open
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"no local header for {info.filename}")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_length + extra_length)
        version = np.lib.format.read_magic(f)
        readers = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            raise ValueError(f"{info.filename}: .npy format {version} is not one a trace "
                             f"writes")
        shape, fortran, dtype = readers[version](f)
        offset = f.tell()
        if dtype.hasobject:
            raise ValueError(f"{info.filename} holds Python objects, which a trace never stores")
        end = offset + dtype.itemsize * int(np.prod(shape))
        if end > info.header_offset + 30 + name_length + extra_length + info.file_size:
            raise ValueError(f"{info.filename}: its header promises more data than it holds")
        return MappedMember(self._open, offset, dtype, tuple(shape), fortran, info.file_size)


class MappedMember:
    """An array stored uncompressed in an open file at a known offset: `load()` maps it
    read-only. The file stays open while a member of it is referenced, so the data stays
    readable even after the file is removed (POSIX); it closes with the last member."""

    __slots__ = ("file", "offset", "dtype", "shape", "fortran", "nbytes")

    def __init__(self, file, offset: int, dtype: np.dtype, shape: tuple, fortran: bool,
                 nbytes: int):
        self.file, self.offset, self.dtype, self.shape = file, offset, dtype, shape
        self.fortran, self.nbytes = fortran, nbytes

    def load(self) -> np.ndarray:
        if not int(np.prod(self.shape)):
            return np.zeros(self.shape, self.dtype)
        order = "F" if self.fortran else "C"
        mapped = np.memmap(self.file, dtype=self.dtype, mode="r", offset=self.offset,
                           shape=self.shape, order=order)
        return np.asarray(mapped).reshape(self.shape, order=order)


class OpenFile:
    """A file open for reading, closed when the last reference to it goes (np.memmap maps
    from it: it has the file methods np.memmap uses)."""

    def __init__(self, path: Path):
        self._file = open(path, "rb")

    def read(self, *args):
        return self._file.read(*args)

    def seek(self, *args):
        return self._file.seek(*args)

    def tell(self):
        return self._file.tell()

    def fileno(self):
        return self._file.fileno()

    def __del__(self):
        self._file.close()


class DigestMismatch(ValueError):
    def __init__(self, path: Path):
        super().__init__(f"{path}: its sha256 differs from the one recorded")
        self.path = path


READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError,
               struct.error)
