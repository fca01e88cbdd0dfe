"""Writing files so that a reader never sees half of one, and JSON for numpy values."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


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
