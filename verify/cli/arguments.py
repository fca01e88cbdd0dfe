"""What the commands share: the error for bad input, and the options several commands take."""
from __future__ import annotations

import argparse

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
