"""What the end of a parity session does besides rendering: the options and provenance its run
record holds, and the report directory made ready for the next run (the kept traces replaced by
this run's, the parts of earlier runs removed).

Nothing here runs an implementation or imports TensorFlow.

>>> run_options(SuiteOptions(replicas=(1, 2)), None)["replicas"]
'1,2'
>>> RUN_DIR.match("20240101-000000-42").group(1)   # the pid of the run that wrote the parts
'42'
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from verify.core.case import SuiteOptions
from verify.core.scratch import pid_alive
from verify.store.history import git_commit, run_record
from verify.store.kept_traces import TRACES_DIR, suite_traces
from verify.store.results import RunResults

# A run's parts directory: <date>-<time>-<pid> (verify.session.plugin's run id).
RUN_DIR = re.compile(r"^\d{8}-\d{6}-(\d+)$")


def run_options(options: SuiteOptions, case_names: list[str] | None) -> dict[str, Any]:
    """The options that shape the numbers, as recorded in summaries and run records."""
    shown = {"device": options.device, "steps": options.steps or "case default",
             "replicas": ",".join(map(str, options.replicas)), "full": options.full,
             "cases": ",".join(case_names) if case_names else "all",
             "sensitivity": options.sensitivity}
    if options.shard is not None:
        shown["shard"] = "{}/{}".format(*options.shard)
    return shown


def session_record(results: RunResults, run_id: str, repository: Path, keep_traces: bool,
                   run_timeout: Any) -> dict[str, Any]:
    """The run record of a session's results, with its provenance: the git commit of
    `repository`, each case's seed, whether traces were kept and the run time limit."""
    known = results.pairs.dropna(subset=["seed"])
    seeds = {str(c): int(s) for c, s in zip(known["case"], known["seed"])}
    return run_record(results, run_id=run_id,
                      provenance={"git_commit": git_commit(repository),
                                  "seeds": seeds, "keep_traces": keep_traces,
                                  "run_timeout": run_timeout})


def judged_keys(results: RunResults) -> set[tuple[str, str, str]]:
    """(case, reference, candidate) of every pair the results judged."""
    pairs = results.pairs
    if pairs.empty:
        return set()
    return set(zip(pairs["case"].astype(str), pairs["reference"].astype(str),
                   pairs["candidate"].astype(str)))


def replace_kept_traces(report_dir: Path, staged: Path, run_id: str,
                        keep_traces: bool) -> str | None:
    """The kept traces are this report's: this run's (`staged`) when it kept some, none when
    it was not asked to keep them; an earlier run's stay only while this run kept nothing.
    Only a traces directory the suite wrote is replaced or removed (`suite_traces`): when
    another is in the way, the note returned says so (None otherwise)."""
    traces_dir = report_dir / TRACES_DIR
    ours = traces_dir.exists() and suite_traces(traces_dir)
    foreign = (traces_dir.exists() or traces_dir.is_symlink()) and not ours
    if keep_traces and staged.is_dir():
        if foreign:
            return (f"parity: {traces_dir} is not a traces directory the suite wrote, so it is "
                    f"left as it is; this run's traces are in {staged} until the next run")
        replaced = report_dir / f".{TRACES_DIR}-replaced-{run_id}"
        if ours:
            traces_dir.rename(replaced)
        staged.rename(traces_dir)
        shutil.rmtree(replaced, ignore_errors=True)
    elif not keep_traces and ours:
        shutil.rmtree(traces_dir, ignore_errors=True)   # an earlier report's
    return None


def remove_earlier_parts(parts_dir: Path, run_id: str) -> None:
    """Remove the parts of earlier runs beside this run's `parts_dir`: only run directories
    the suite names (never a link, never inside a `parts` that links out of the report
    directory), and never those of a run still alive."""
    parts = parts_dir.parent
    if parts.is_symlink() or not parts.is_dir():
        return
    for old in parts.iterdir():
        found = RUN_DIR.match(old.name)
        if found is None or old.is_symlink() or not old.is_dir():
            continue
        if old.name == run_id:
            continue
        if not pid_alive(int(found.group(1))):
            shutil.rmtree(old, ignore_errors=True)


def remove_own_parts(parts_dir: Path) -> None:
    """Remove this run's parts once its final report holds them, and the `parts` directory
    when that leaves it empty (never a `parts` that is a link: only the run directory the
    suite made inside it)."""
    if parts_dir.is_dir() and not parts_dir.is_symlink():
        shutil.rmtree(parts_dir, ignore_errors=True)
    parts = parts_dir.parent
    if parts.is_dir() and not parts.is_symlink():
        try:
            parts.rmdir()
        except OSError:   # another run's parts are there
            pass
