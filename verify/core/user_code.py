"""What makes an exception the user's error: raised by the user's own code (a case module, an
entry point given to `init`), it is reported as bad input naming the entry point and the last
frames in the user's files; raised by the suite's own code, it is the suite's failure.
"""
from __future__ import annotations

import contextlib
import sysconfig
import traceback
from pathlib import Path

ENTRY_ATTRIBUTE = "parity_entry_point"   # set on an exception raised under `entry_point`


@contextlib.contextmanager
def entry_point(name: str):
    """Calls into the user's code (`name`: how the command line gave it, e.g. `--examples
    pipeline:examples`): an exception raised under it names it, for `user_error`."""
    try:
        yield
    except Exception as e:
        if not hasattr(e, ENTRY_ATTRIBUTE):
            setattr(e, ENTRY_ATTRIBUTE, name)
        raise


def user_error(error: BaseException) -> str | None:
    """The message of an exception raised by the user's code, or None when the suite's own
    code raised it: the innermost frame outside Python's and the installed libraries is the
    user's (not the suite's). Names the entry point and the last frames in the user's files.

    >>> print(user_error(SyntaxError("invalid syntax", ("pipeline.py", 3, 1, "def f(:"))))
    your code has a SyntaxError: invalid syntax (pipeline.py, line 3)
    """
    if isinstance(error, SyntaxError) and error.filename and not _suites(error.filename):
        return (f"your code has a SyntaxError: {error.msg} ({error.filename}, line "
                f"{error.lineno})" + _entry(error))
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not _library(f.filename)]
    if not frames or _suites(frames[-1].filename):
        return None
    users = [f for f in frames if not _suites(f.filename)][-3:]
    shown = "".join(f"\n  {f.filename}, line {f.lineno}, in {f.name}: {(f.line or '').strip()}"
                    for f in users)
    return (f"your code raised {type(error).__name__}: {error}" + _entry(error) + shown
            + "\nfix it there and run the command again")


def _entry(error: BaseException) -> str:
    entry = getattr(error, ENTRY_ATTRIBUTE, None)
    return f" (called as {entry})" if entry else ""


def _suites(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(SUITE)


def _library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = Path(filename).resolve()
    return (any(path.is_relative_to(root) for root in LIBRARIES)
            and not path.is_relative_to(SUITE))


SUITE = Path(__file__).resolve().parents[1]   # the verify package
LIBRARIES = tuple({Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
                   if (p := sysconfig.get_paths().get(key))})
