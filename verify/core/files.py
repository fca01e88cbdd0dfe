"""Writing files so that a reader never sees half of one, JSON for numpy values, and the one
error every reader raises for a file it cannot use (`BadFile`)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


class BadFile(ValueError):
    """A file the suite reads is missing, cut short, malformed or not what it claims to be.

    The message names the file, what is wrong with it and what to do about it.

    >>> print(BadFile("traces/tiny/tf2.npz", "cut short", "write the trace again"))
    traces/tiny/tf2.npz: cut short; write the trace again
    """

    def __init__(self, path: str | os.PathLike, problem: str, remedy: str):
        self.path, self.problem, self.remedy = str(path), problem, remedy
        super().__init__(f"{path}: {problem}; {remedy}")


def read_json(path: str | os.PathLike, remedy: str) -> Any:
    """The JSON document in `path`, or a `BadFile` saying why there is none.

    >>> read_json("/nonexistent.json", "pass another file")
    Traceback (most recent call last):
    ...
    verify.core.files.BadFile: /nonexistent.json: no such file; pass another file
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadFile(path, "no such file", remedy) from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadFile(path, f"cannot be read ({e})", remedy) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadFile(path, f"not JSON, or cut short ({e})", remedy) from None


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write a file so that readers see the old content or the new one, never a part.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "a" / "x.txt"
    >>> write_atomic(target, "done"); target.read_text()
    'done'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_default(value):
    """`json.dumps(default=...)` for numpy scalars and paths; NaN floats stay NaN.

    >>> import json; json.dumps({"n": np.int64(3)}, default=json_default)
    '{"n": 3}'
    """
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return str(value)
