"""`python -m verify suite`: run the installed parity suite on a repository's own cases.

A repository that installs the suite (`pip install tf-migration-parity` from a git URL or a
wheel) has no copy of this project's `verify/` directory to point pytest at. This runs pytest
on the installed `verify/test_parity.py` with the plugin, from the working directory:

    python -m verify suite --cases parity_cases                  # reports/ in the working dir
    python -m verify suite --cases parity_cases --report-dir out -n 2 -k quadratic
    tf-migration-parity suite --cases my_pkg.parity_cases        # the console script

Every argument goes to pytest unchanged (the plugin's --cases, --report-dir, --steps, ... and
pytest's own -n, -k, -x, ...); a leading `--` is dropped. The working directory is pytest's
rootdir, so relative --cases and --report-dir are read from there (default `cases` and
`reports`). The repository's own pytest configuration (pytest.ini, pyproject.toml, conftest.py)
is not read: the suite runs as shipped. The exit status is pytest's: 0 all pairs passed, 1 a
pair failed or the run was incomplete, 2 interrupted, 3 internal error, 4 usage error, 5 no
test collected.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# The same warnings the project's own pytest configuration ignores (pyproject.toml).
WARNING_FILTERS = (
    "ignore::DeprecationWarning",
    "ignore:To make it possible to preserve tf.data options:UserWarning",
)


def parity_test_file() -> Path:
    """The installed parity test module, next to this package's other modules.

    >>> parity_test_file().name
    'test_parity.py'
    """
    path = Path(__file__).resolve().parent.parent / "test_parity.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the installed verify package is incomplete; "
                                f"reinstall tf-migration-parity")
    return path


def suite_command(args: list[str], cwd: Path | None = None) -> list[str]:
    """pytest's arguments for running the parity suite with `args` passed through.

    >>> suite_command(["--cases", "parity_cases"], cwd=Path("/repo"))[-4:]
    ['--rootdir', '/repo', '--cases', 'parity_cases']
    """
    args = list(args[1:] if args[:1] == ["--"] else args)
    cwd = Path(cwd or Path.cwd())
    command = [str(parity_test_file()), "-p", "verify.session.plugin",
               # No ini file and no conftest.py of the calling repository: the suite as shipped.
               "-c", os.devnull, "--confcutdir", str(parity_test_file().parent)]
    for warning in WARNING_FILTERS:
        command += ["-W", warning]
    if not any(a == "--rootdir" or a.startswith("--rootdir=") for a in args):
        command += ["--rootdir", str(cwd)]
    return command + args


def run_suite(args: list[str]) -> int:
    """Run the parity suite in this process; pytest's exit status.

    >>> run_suite(["--cases", "parity_cases", "-n", "2"])  # doctest: +SKIP
    0
    """
    import pytest

    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)   # then pytest's help, which lists the plugin's options
    return int(pytest.main(suite_command(args)))


if __name__ == "__main__":
    sys.exit(run_suite(sys.argv[1:]))
