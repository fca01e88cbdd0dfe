"""The parity suite's pytest options (verify/session/plugin.py adds them): their definitions, the
SuiteOptions they ask for, and the checks made of them when pytest starts, before anything
trains (a bad option, a directory that cannot be written, a --compare-to run that cannot be
read). Each problem is a pytest usage error that says what is wrong.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from verify.core.case import DEFAULT_RUN_TIMEOUT, SuiteOptions
from verify.core.meta import SUITE_ENVIRONMENT
from verify.environments.declared import declared_environments
from verify.store.history import DEFAULT_FACTOR, check_record, load_record
from verify.store.report_dir import OutputNotWritable, check_writable
from verify.session.parity_session import ParitySession


def add_options(parser) -> None:
    """The parity group of pytest's options (`pytest --help` lists them)."""
    group = parser.getgroup("parity", "numerical parity of TensorFlow migrations")
    group.addoption("--tpu", action="store_true",
                    help="run the implementations on a real TPU (TPUClusterResolver); fails, "
                         "saying why, when no TPU is reachable")
    group.addoption("--tpu-name", default="", help="TPU name or grpc address ('' = local TPU VM)")
    group.addoption("--tpu-tables-every", type=int, default=None, metavar="K",
                    help="with --tpu: read the embedding tables and their slots back from the "
                         "TPU every K steps (default every step for runs of up to 100 steps, "
                         "about 100 reads for longer ones)")
    group.addoption("--steps", type=int, default=None,
                    help="training steps per run (default: each case's own)")
    group.addoption("--report-dir", default="reports", help="where the report is written")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only shard K of N of the selected pairs (stable: a pair's shard "
                         "comes from its id); join the shards' report directories with "
                         "python -m verify report merge DIR... --out DIR")
    group.addoption("--replay-layers", default="diverging", choices=("diverging", "all", "off"),
                    help="replay a pair's first divergent step layer by layer and name the "
                         "first divergent layer: for pairs that first diverge in their loss "
                         "or gradients (diverging, the default; mutants excepted), for every "
                         "pair (all: step 1 where nothing diverges), or never (off); "
                         "substitution (local or carried in, and its repro) follows the same "
                         "setting, and also covers pairs first diverging in their weights")
    group.addoption("--replicas", default="1,2,4,8",
                    help="comma-separated replica counts of candidates to run (default 1,2,4,8)")
    group.addoption("--sensitivity", action="store_true",
                    help="add automatic mutants (learning rate x1.01, gradients clipped at "
                         "their median norm, one step's gradients dropped) of every faithful "
                         "candidate; shipped cases run theirs always")
    group.addoption("--full", action="store_true",
                    help="the long tier: cases run their full-length training")
    group.addoption("--data-dir", default=None, help="directory with real datasets for cases")
    group.addoption("--case", action="append", default=None, dest="parity_cases",
                    help="run only this case (repeatable)")
    group.addoption("--cases", action="append", default=None, dest="case_sources",
                    help="where cases come from: a directory of case modules, a case module's "
                         ".py file or an importable module name (repeatable; default the "
                         "project's cases/ directory)")
    _add_report_options(group)


def _add_report_options(group) -> None:
    """The rest: what a run keeps and compares with (traces, history, goldens), which
    environments it runs, and its time limit."""
    group.addoption("--keep-traces", action="store_true",
                    help="save every run's trace (npz + json) and the case's tolerances under "
                         "<report-dir>/traces/, for `python -m verify compare/report`")
    group.addoption("--history-dir", default=None,
                    help="where every run adds its run record (default <report-dir>/history; "
                         "'none' to keep no history)")
    group.addoption("--compare-to", default=None,
                    help="a previous run record, report directory or history directory (its "
                         "latest run): report regressions since that run")
    group.addoption("--regression-factor", type=float, default=DEFAULT_FACTOR,
                    help=f"with --compare-to: a worst drift grown more than this many times is a "
                         f"regression (default {DEFAULT_FACTOR:g})")
    group.addoption("--save-golden", default=None, metavar="DIR",
                    help="store the reference trace of every judged pair in DIR (golden "
                         "references, see verify/store/golden.py)")
    group.addoption("--golden", default=None, metavar="DIR",
                    help="read implementations that are no selected pair's candidate from the "
                         "golden references in DIR instead of running them")
    group.addoption("--env", action="append", default=None, dest="parity_envs",
                    help="only pairs whose candidate runs in this environment (repeatable; "
                         "'local' is the suite's own; see python -m verify envs list)")
    group.addoption("--run-timeout", type=float, default=DEFAULT_RUN_TIMEOUT,
                    help=f"seconds one run of one implementation may take; a longer run fails "
                         f"with the steps it captured (default {DEFAULT_RUN_TIMEOUT:g}; 0 for "
                         f"no limit)")


def suite_options(config) -> SuiteOptions:
    """The SuiteOptions the options ask for; a pytest usage error names a bad one."""
    steps = config.getoption("steps")
    if steps is not None and steps <= 0:
        raise pytest.UsageError(f"--steps must be a positive number of steps, got {steps}")
    raw = config.getoption("replicas")
    try:
        replicas = tuple(sorted({int(r) for r in raw.split(",") if r.strip()}))
    except ValueError:
        raise pytest.UsageError(f"--replicas takes comma-separated whole numbers like 1,2,4,8; "
                                f"got {raw!r}") from None
    if not replicas or min(replicas) < 1:
        raise pytest.UsageError(f"--replicas needs counts >= 1, got {raw!r}")
    data_dir = config.getoption("data_dir")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise pytest.UsageError(f"--data-dir {data_dir} is not a directory")
    every = config.getoption("tpu_tables_every")
    if every is not None and every < 1:
        raise pytest.UsageError(f"--tpu-tables-every takes a number of steps >= 1, got {every}")
    timeout = config.getoption("run_timeout")
    if not timeout >= 0:
        raise pytest.UsageError(f"--run-timeout takes seconds >= 0 (0 for no limit), got "
                                f"{timeout:g}")
    envs = tuple(e for given in config.getoption("parity_envs") or () for e in given.split(",")
                 if e.strip())
    return SuiteOptions(steps=steps, device="tpu" if config.getoption("tpu") else "cpu",
                        shard=shard_option(config.getoption("shard")),
                        environments=envs,
                        tpu_name=config.getoption("tpu_name"), tpu_tables_every=every,
                        replicas=replicas,
                        full=config.getoption("full"),
                        sensitivity=config.getoption("sensitivity"),
                        data_dir=Path(data_dir) if data_dir else None,
                        run_timeout=timeout or None,
                        replay_layers=config.getoption("replay_layers"))


def selection_options(config) -> dict[str, str]:
    """What selects the pairs besides the SuiteOptions, as the run record keeps it (so that
    `report merge` refuses shards that selected differently): the case sources as given, the
    -k and -m expressions, --env and --golden."""
    return {"case_sources": ",".join(config.getoption("case_sources") or ["cases"]),
            "keyword": config.getoption("keyword") or "",
            "markexpr": config.getoption("markexpr") or "",
            "environments": ",".join(config.getoption("parity_envs") or ()),
            "golden": str(config.getoption("golden") or "")}


def shard_option(given: str | None) -> tuple[int, int] | None:
    """`--shard K/N` as (K, N); a pytest usage error names a malformed one.

    >>> shard_option("2/3"), shard_option(None)
    ((2, 3), None)
    """
    if given is None:
        return None
    try:
        shard, shards = (int(part) for part in given.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N (shard K of N, e.g. 2/3), got {given!r}") \
            from None
    if not 1 <= shard <= shards:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {given!r}")
    return shard, shards


def path_option(config, name: str) -> Path | None:
    """A path option, relative to the rootdir like --report-dir."""
    value = config.getoption(name)
    if value is None:
        return None
    path = Path(value)
    return path if path.is_absolute() else Path(config.rootpath) / path


def history_dir(config, report_dir: Path) -> Path | None:
    value = config.getoption("history_dir")
    if value is None:
        return report_dir / "history"
    return None if value.strip().lower() in ("none", "") else path_option(config, "history_dir")


def project_environments(config, options: SuiteOptions) -> dict:
    """The environments the rootdir's pyproject.toml declares; --env must name them."""
    pyproject = Path(config.rootpath) / "pyproject.toml"
    try:
        declared = declared_environments(pyproject)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    unknown = sorted(set(options.environments) - set(declared) - {SUITE_ENVIRONMENT})
    if unknown:
        raise pytest.UsageError(f"--env {','.join(unknown)}: not declared in {pyproject}; "
                                f"known: {', '.join([SUITE_ENVIRONMENT, *sorted(declared)])}")
    return declared


def golden_dir(config) -> Path | None:
    golden = path_option(config, "golden")
    if golden is not None and not golden.is_dir():
        raise pytest.UsageError(f"--golden {golden} is not a directory of golden references "
                                f"(write one with --save-golden {golden})")
    if golden is not None and config.getoption("save_golden"):
        raise pytest.UsageError("--golden and --save-golden together would store goldens read "
                                "from goldens: use one")
    return golden


def absolute_source(given: str, root: Path) -> str:
    """A case source as another process can find it: paths made absolute."""
    for path in (Path(given), root / given):
        if path.exists():
            return str(path.resolve())
    return given


def check_outputs(parity: ParitySession) -> None:
    """Fail now, before anything trains, when a report or history cannot be written."""
    outputs = [("--report-dir", parity.report_dir)]
    for variable in ("PARITY_SPILL_DIR", "PARITY_ENV_DIR"):   # scratch and environments
        value = os.environ.get(variable, "").strip()
        if value:
            outputs.append((f"{variable}=", Path(value)))
    if parity.history_dir is not None:
        outputs.append(("--history-dir", parity.history_dir))
    if parity.save_golden is not None:
        outputs.append(("--save-golden", parity.save_golden))
    for option, directory in outputs:
        try:
            check_writable(directory, option)
        except OutputNotWritable as e:
            raise pytest.UsageError(str(e)) from None


def previous_run(path: Path, damaged: list[str]) -> dict | None:
    """The --compare-to run record, checked now so that comparing at the end cannot fail. In a
    history directory, damaged records are skipped and named in `damaged` (the report says
    which run it compared with instead)."""
    try:
        record = load_record(path, damaged=damaged)
        if record is not None:
            check_record(record)
    except (FileNotFoundError, ValueError) as e:
        raise pytest.UsageError(f"--compare-to {path}: {e}") from None
    return record

