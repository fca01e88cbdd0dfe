"""What the commands share: the error for bad input, the options several commands take, the
checks of output paths made before any work."""
from __future__ import annotations

import argparse
from pathlib import Path

from verify.store.history import DEFAULT_FACTOR


class InputError(Exception):
    """Bad input from the command line: printed as `error: ...`, exit status 2."""


def comparison_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare-to", help="a previous run record, report directory or "
                                             "history directory: report regressions since it")
    factor_argument(parser)


def factor_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regression-factor", type=float, default=DEFAULT_FACTOR,
                        help=f"worst drift growth that counts as a regression "
                             f"(default {DEFAULT_FACTOR:g})")


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (steps, batch size); argparse says what is wrong.

    >>> positive_int("3")
    3
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a whole number >= 1, got '0'
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def check_output_dir(directory: Path, option: str) -> None:
    """Refuse, before any work, an output directory that is a file, lies under a file or
    cannot be created and written (`InputError` naming the option)."""
    from verify.store.report_dir import OutputNotWritable, check_writable

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{option} {directory} exists and is not a directory; pass a "
                         f"directory (or a new path)")
    try:
        check_writable(directory, option)
    except OutputNotWritable as e:
        raise InputError(str(e)) from None


def check_output_file(path: Path, option: str) -> None:
    """Refuse, before any work, an output file that is a directory or another kind of file, or
    whose directory cannot be created and written."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {path} exists and is not a regular file (a directory?); "
                         f"pass the path of a file to write")
    check_output_dir(path.parent, option)
