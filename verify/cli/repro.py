"""`python -m verify repro DIR`: run the standalone repros a report holds
(`verify.explain.repro`), each in the environment its pair's candidate ran in.

DIR is a report directory, its `repro/` folder, or one pair's repro folder: every `repro.py`
beside a `repro.json` under it runs as a fresh, isolated interpreter (`python -I`) of that
environment (the suite's own Python for `local`, a declared environment's once it is built),
from a temporary working directory: neither the checkout nor PYTHONPATH is on its path (the
script imports nothing of the suite; an environment that installs the suite still could).
Each one's output is printed with its exit status; the command exits 1 when any repro shows
its difference (exits non-zero), 0 when none does, 2 when there is no repro under DIR, a
repro's record is damaged or names an environment not declared or not built (each said before
any repro runs), or a repro raised (a traceback: Python exits 1 then too, which is not
a difference shown) or did not finish within `TIMEOUT`.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from verify.cli.arguments import InputError

TIMEOUT = 600   # seconds one repro may take


def add_repro_parser(commands) -> None:
    parser = commands.add_parser(
        "repro", help="run the standalone repros of a report (repro/<case>/<pair>/repro.py), "
                      "each alone in its environment; 1 when any shows its difference")
    parser.add_argument("directory", type=Path,
                        help="a report directory, its repro/ folder or one pair's folder")
    parser.add_argument("--project", default="pyproject.toml",
                        help="the pyproject.toml declaring the environments (default: "
                             "./pyproject.toml)")
    parser.set_defaults(run=repro_command)


def repro_command(args) -> int:
    """Run every repro under `args.directory` (see the module's docstring)."""
    scripts = sorted(p.parent for p in Path(args.directory).rglob("repro.json")
                     if (p.parent / "repro.py").is_file())
    if not scripts:
        raise InputError(f"no repro under {args.directory}: a report holds repro/<case>/"
                         f"<reference>--<candidate>/repro.py only for a pair whose layer "
                         f"substitution found a layer local")
    # every repro's interpreter first: a damaged record or an unbuilt environment is said
    # before any repro runs (each may take up to TIMEOUT), not after some have
    pythons = [_python(_environment(folder), Path(args.project)) for folder in scripts]
    differs = failed = False
    for folder, python in zip(scripts, pythons):
        with tempfile.TemporaryDirectory(prefix="parity-repro-") as elsewhere:
            try:
                done = subprocess.run([str(python), "-I", str((folder / "repro.py").resolve())],
                                      cwd=elsewhere, capture_output=True, text=True,
                                      timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                print(f"{folder}: did not finish within {TIMEOUT} s: it shows nothing")
                failed = True
                continue
        if done.returncode and RAISED in done.stderr:   # Python exits 1 on an error too
            print(f"{folder}: raised (exit {done.returncode}): it shows nothing\n"
                  f"{done.stderr.strip()[-2000:]}")
            failed = True
            continue
        print(f"{folder}: exit {done.returncode}")
        print(done.stdout.rstrip() or done.stderr.strip()[-2000:])
        differs = differs or bool(done.returncode)
    if failed:
        print("some repros did not run to their verdict (above): exit 2", file=sys.stderr)
        return 2
    return 1 if differs else 0


RAISED = "Traceback (most recent call last):"   # what a repro that raised wrote last


def _environment(folder: Path) -> str:
    """The environment `folder`'s repro.json names; an InputError when it cannot be read."""
    path = folder / "repro.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path} cannot be read as a repro record ({type(e).__name__}: "
                         f"{e}); write the report again, or remove that folder") from None
    if not isinstance(record, dict) or not isinstance(record.get("environment", "local"), str):
        raise InputError(f"{path} is not a repro record (an object whose 'environment' is a "
                         f"name); write the report again, or remove that folder")
    return record.get("environment", "local")


def _python(environment: str, project: Path) -> Path:
    """The interpreter of `environment`: this one for the suite's own, else the built one."""
    from verify.core.meta import SUITE_ENVIRONMENT
    from verify.environments import declared as envs

    if environment == SUITE_ENVIRONMENT:
        return Path(sys.executable)
    declared = envs.declared_environments(project).get(environment)
    if declared is None:
        raise InputError(f"the repro runs in environment {environment!r}, which {project} "
                         f"does not declare")
    if not envs.is_ready(declared, envs.default_cache()):
        raise InputError(f"environment {environment!r} is not built: python -m verify envs "
                         f"create {environment}")
    return envs.python_of(declared.directory(envs.default_cache()))
