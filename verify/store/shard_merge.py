"""Join the report directories of `--shard K/N` runs into one report (TensorFlow-free).

A nightly job with many cases runs as a CI matrix: each job `pytest verify/ --shard K/N`
writes its own report directory; `python -m verify report merge DIR... --out DIR` reads them
back (`verify.store.results.read_report`) and writes one report, run record and PR summary, as one
unsharded run would have. It refuses shards that cannot be one run: of different commits or
options (shard aside), different shard counts, a shard given twice, or a report that is no
shard. A shard that is missing, or that did not finish, makes the merged run INCOMPLETE and
is listed as not run. Each shard is judged from its own evidence first: its run.json,
summary.csv and drift.csv.gz must agree (`evidence_disagreement`), and the shards must have
selected pairs alike (case sources, -k, -m, --env, --golden, --steps, --replicas: the options
each run records), else the merge is refused naming the shard and what differs.

>>> shard_of_record({"options": {"shard": "2/3"}})
(2, 3)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from verify.core.files import read_json
from verify.store.results import (RunResults, concat_frames, sort_preflight, suite_environment,
                            REPORT_REMEDY)

SAME_PROVENANCE = ("git_commit",)


class ShardMismatch(ValueError):
    """The given report directories cannot be joined into one run; says which and why."""


def shard_of_record(record: dict[str, Any]) -> tuple[int, int] | None:
    """The (K, N) a run record says it ran as (`options.shard`), None for an unsharded run."""
    shard = (record.get("options") or {}).get("shard")
    if not shard:
        return None
    k, n = (int(part) for part in str(shard).split("/"))
    return k, n


def merge_shards(directories: list[Path]) -> tuple[RunResults, dict[str, Any]]:
    """The shards' results joined, and the provenance the merged record carries (the shards'
    common one, with the shards listed). Raises `ShardMismatch` saying what differs."""
    from verify.store.results import read_report

    from verify.store.report_dir import unfinished_run

    records, results = [], []
    for directory in directories:
        unfinished = unfinished_run(Path(directory))
        if unfinished:
            raise ShardMismatch(f"{directory}: {unfinished} Run that shard again, or merge "
                                f"without it (the merged run is then INCOMPLETE)")
        path = Path(directory) / "run.json"
        if not path.is_file():
            raise ShardMismatch(f"{directory} holds no run.json: pass the report directories "
                                f"of `pytest verify/ --shard K/N` runs")
        records.append(read_json(path, REPORT_REMEDY))
        results.append(read_report(Path(directory)))
        disagreement = evidence_disagreement(records[-1], results[-1])
        if disagreement:
            raise ShardMismatch(f"{directory}: its files disagree, so its verdict cannot be "
                                f"trusted: {disagreement}. Run that shard again (or download "
                                f"its report directory again: a truncated upload?)")
    shards = [shard_of_record(record) for record in records]
    for directory, shard in zip(directories, shards):
        if shard is None:
            raise ShardMismatch(f"{directory} is not a shard (its run.json has no "
                                f"options.shard): run it with --shard K/N")
    counts = {n for _, n in shards}
    if len(counts) != 1:
        raise ShardMismatch(f"the shards are of different shard counts {sorted(counts)}: "
                            f"{_listed(directories, shards)}")
    seen: dict[int, Path] = {}
    for directory, (k, _) in zip(directories, shards):
        if k in seen:
            raise ShardMismatch(f"shard {k} is given twice: {seen[k]} and {directory}")
        seen[k] = directory
    _check_same(records, directories, "options", lambda r: {
        k: v for k, v in (r.get("options") or {}).items() if k != "shard"})
    for key in SAME_PROVENANCE:
        _check_same(records, directories, f"provenance {key}",
                    lambda r: (r.get("provenance") or {}).get(key))
    (count,) = counts
    merged = _joined(results)
    merged.options = {k: v for k, v in records[0].get("options", {}).items() if k != "shard"}
    for missing in sorted(set(range(1, count + 1)) - set(seen)):
        merged.not_run[f"shard {missing}/{count}"] = (
            f"not merged: no report directory of shard {missing}/{count} was given")
    provenance = {key: (records[0].get("provenance") or {}).get(key) for key in SAME_PROVENANCE}
    provenance["merged_shards"] = {f"{k}/{n}": str(d) for d, (k, n) in zip(directories, shards)}
    provenance["shard_runs"] = [record.get("run_id") for record in records]
    return merged, provenance


def evidence_disagreement(record: dict[str, Any], results: RunResults) -> str | None:
    """Where a report directory's own files disagree (None when they agree): run.json's
    verdict and counts against summary.csv's pairs, and drift.csv.gz's rows against both (no
    rows of a pair summary.csv does not list; no failing row in a pair it calls PASS)."""
    from verify.judge.verdict import PASS

    pairs = results.pairs
    counts = {str(k): int(v) for k, v in pairs["verdict"].value_counts().items()}
    if counts != record.get("counts", {}):
        return (f"run.json counts {record.get('counts') or 'no pairs'}, summary.csv holds "
                f"{counts or 'no pairs'}")

    def key(case, reference, candidate, replicas):
        return f"{case}:{reference}-vs-{candidate} x{replicas}"

    listed = {key(p["case"], p["reference"], p["candidate"], p["replicas"])
              for p in record.get("pairs", [])}
    summary = {key(*p): verdict for *p, verdict in zip(
        pairs["case"], pairs["reference"], pairs["candidate"], pairs["replicas"],
        pairs["verdict"])}
    if listed != set(summary):
        return (f"run.json lists the pairs {sorted(listed)}, summary.csv "
                f"{sorted(summary)}")
    if record.get("verdict") != results.verdict:
        return (f"run.json says {record.get('verdict')}, its summary.csv and not-run list make "
                f"it {results.verdict}")
    rows = results.rows
    for pair, failed in rows.groupby([rows["case"], rows["reference"], rows["candidate"],
                                      rows["replicas"]], sort=True)["passed"]:
        name = key(*pair)
        if name not in summary:
            return f"drift.csv.gz holds rows of {name}, which summary.csv does not list"
        if summary[name] == PASS and not failed.astype(bool).all():
            return (f"drift.csv.gz holds failing rows of {name}, which summary.csv and "
                    f"run.json call PASS")
    return None


def _joined(results: list[RunResults]) -> RunResults:
    from verify.judge.layers import LAYER_COLUMNS
    from verify.judge.pair import LOSS_COLUMNS
    from verify.judge.preflight import COLUMNS as PREFLIGHT_COLUMNS
    from verify.judge.records import COLUMNS, PAIR_COLUMNS

    merged = RunResults(rows=concat_frames([r.rows for r in results], COLUMNS),
                        pairs=concat_frames([r.pairs for r in results], PAIR_COLUMNS),
                        losses=concat_frames([r.losses for r in results], LOSS_COLUMNS),
                        environment=suite_environment([r.environment for r in results]),
                        preflight=sort_preflight(concat_frames([r.preflight for r in results],
                                                               PREFLIGHT_COLUMNS)),
                        layers=concat_frames([r.layers for r in results], LAYER_COLUMNS))
    for r in results:
        merged.lost.update(r.lost)
        merged.not_run.update(r.not_run)
    merged.stopped = "; ".join(r.stopped for r in results if r.stopped)
    merged.nothing_selected = "; ".join(r.nothing_selected for r in results
                                        if r.nothing_selected and r.pairs.empty)
    return merged


def _check_same(records, directories, what: str, value) -> None:
    values = [value(record) for record in records]
    if any(v != values[0] for v in values[1:]):
        shown = "; ".join(f"{d}: {v}" for d, v in zip(directories, values))
        raise ShardMismatch(f"the shards differ in {what}, so they are not one run: {shown}")


def _listed(directories, shards) -> str:
    return ", ".join(f"{d} ({k}/{n})" for d, (k, n) in zip(directories, shards))


def copy_repros(directories: list[Path], out: Path) -> list[Path]:
    """Each shard's repros (`repro/<case>/<pair>/`, `verify.explain.repro`) copied into the
    merged report, where its pairs' `repro` columns point: shards hold disjoint pairs, so no
    folder is written twice. Returns the folders copied."""
    import shutil

    copied = []
    for directory in directories:
        for record in sorted((Path(directory) / "repro").glob("*/*/repro.json")):
            target = Path(out) / record.parent.relative_to(directory)
            shutil.copytree(record.parent, target, dirs_exist_ok=True)
            copied.append(target)
    return copied
