"""`compare` and `report`: judge two kept traces again, and re-render a report directory
(from its drift.csv.gz, or from its kept traces with --recompare)."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
from pathlib import Path

from verify.cli.arguments import InputError, check_output_dir, comparison_arguments
from verify.core.case import PairSpec
from verify.core.files import read_json
from verify.store.history import RunComparison, compare_runs, load_record, run_record
from verify.explain import explain_pair
from verify.judge import judge_pair, unjudged
from verify.judge.verdict import GOOD
from verify.store.kept_traces import (MANIFEST, TRACES_DIR, KeptTraces, check_beside_manifest,
                                load_trace, manifest_calibration, read_manifest,
                                read_tolerances, recompare, trace_stem)
from verify.render import write_report
from verify.store.report_dir import record_report_files
from verify.render.html import worst_tensors
from verify.render.text import clip
from verify.render.terminal import terminal_lines
from verify.store.results import RunResults, pair_title, read_report
from verify.core.sensitivity import base_candidate, is_mutant, resolve_spec


def add_compare_parser(commands) -> None:
    compare = commands.add_parser("compare", help="compare two saved traces")
    compare.add_argument("reference", help="reference trace (.json, .npz or their stem)")
    compare.add_argument("candidate", help="candidate trace (.json, .npz or their stem)")
    compare.add_argument("--tolerances", help=f"a {MANIFEST} or tolerances JSON (default: the "
                                              f"{MANIFEST} kept beside the reference trace)")
    compare.add_argument("--out", help="also write a report of this pair into this directory")
    compare.set_defaults(run=compare_command)


def add_report_parser(commands) -> None:
    report = commands.add_parser(
        "report", help="re-render a report directory; `report merge DIR... --out DIR` joins "
                       "the report directories of --shard K/N runs into one report")
    report.add_argument("run_dir", nargs="+",
                        help="a report directory (drift.csv.gz, summary.csv, run.json); after "
                             "`merge`, the shards' report directories")
    report.add_argument("--recompare", action="store_true",
                        help=f"compare the kept traces ({TRACES_DIR}/) again instead of reading "
                             f"drift.csv.gz")
    report.add_argument("--tolerances", help="with --recompare: tolerances for every case")
    report.add_argument("--out", help="where to write (default: run_dir)")
    comparison_arguments(report)
    report.set_defaults(run=report_command)


def compare_command(args) -> int:
    """Judge two kept traces as the run that kept them did (`judge_pair`): numbers, preflight
    from what each side declared, and attribution when the case's oracle trace is beside them.
    A trace that is not what the case.json beside it stores there fails the pair, saying why."""
    if args.out:
        check_report_target(Path(args.out), "--out")
    reference, candidate = load_trace(args.reference), load_trace(args.candidate)
    cases = (reference.meta.case, candidate.meta.case)
    if all(cases) and cases[0] != cases[1]:
        raise InputError(f"the traces are of different cases: {args.reference} of "
                         f"{cases[0]!r}, {args.candidate} of {cases[1]!r} (identical data "
                         f"does not make them one case's pair); compare two traces of one case")
    problems = {trace.implementation: problem for path, trace in (
        (args.reference, reference), (args.candidate, candidate))
        if (problem := check_beside_manifest(path, trace))}
    directory = trace_stem(args.reference).parent
    spec, tolerances, manifest = _compare_settings(args, reference, candidate, directory)
    kept = KeptTraces(directory, manifest)
    calibration = manifest_calibration(manifest) if manifest else None
    given = {reference.implementation: reference, candidate.implementation: candidate}
    if spec.oracle and not kept.has(spec.oracle):
        print(f"attribution: no kept trace of the oracle {spec.oracle!r} beside the reference")
        spec = dataclasses.replace(spec, oracle=None)
    elif spec.oracle and kept.problem(spec.oracle):
        problems[spec.oracle] = kept.problem(spec.oracle)
    if is_mutant(spec.candidate) and not problems:
        base = base_candidate(spec.candidate)
        if kept.problem(base):
            problems[base] = kept.problem(base)
        else:
            spec = resolve_spec(spec, lambda name: given.get(name) or kept(name))
    if problems:
        result = unjudged(spec, problems, tolerances)
    else:
        result = explain_pair(judge_pair(spec, lambda name: given.get(name) or kept(name),
                                         tolerances, calibration=calibration),
                              spec, lambda name: given.get(name) or kept(name))
    print(f"{result.verdict.status}: {pair_title(result.record)}: {result.verdict.message}")
    print(f"preflight: {result.record.preflight}")
    if result.record.attribution:
        print(f"attribution: {result.record.attribution}")
    if result.record.likely_cause:
        print(f"likely cause: {result.record.likely_cause}")
    worst = worst_tensors(result.rows)
    if not worst.empty and not problems:
        print(worst.drop(columns="reason").to_string(index=False))
    if args.out:
        results = RunResults.of([result])
        record = run_record(results, run_id=_run_id("compare"),
                            provenance={"traces": [str(args.reference), str(args.candidate)]})
        with owned_report_dir(Path(args.out), "--out", record["run_id"]):
            written = write_report(Path(args.out), results, record)
            record_report_files(Path(args.out), written)
        print("report: " + ", ".join(str(p) for p in written))
    return 0 if result.verdict.ok else 1


def _compare_settings(args, reference, candidate, directory: Path):
    """The pair's spec, its tolerances and the kept manifest beside the reference (or None):
    from --tolerances (a case.json or a tolerances document) or the case.json beside the
    reference, else the suite's defaults."""
    beside = directory / MANIFEST
    manifest = read_manifest(beside)[0] if beside.is_file() else None
    source = Path(args.tolerances) if args.tolerances else beside
    specs, tolerances = [], None
    if args.tolerances and not _is_manifest(read_json(source, "pass a case.json or a "
                                                              "tolerances JSON file")):
        tolerances = read_tolerances(source)
    elif source.is_file():
        _, specs, tolerances = read_manifest(source)
    if tolerances is None:
        print("tolerances: the suite's defaults (no --tolerances and no kept "
              f"{MANIFEST} beside the reference)")
    else:
        print(f"tolerances: {source}")
    spec = next((s for s in specs if (s.reference, s.candidate) == (
        reference.implementation, candidate.implementation)), None)
    if spec is None:
        spec = PairSpec(candidate.meta.case or reference.meta.case, reference.implementation,
                        candidate.implementation, replicas=candidate.meta.replicas or 1)
    return spec, tolerances, manifest


def _is_manifest(doc) -> bool:
    return isinstance(doc, dict) and "pairs" in doc and "tolerances" in doc


def report_command(args) -> int:
    if args.run_dir[0] == "merge":
        return merge_command(args)
    if len(args.run_dir) > 1:
        raise InputError(f"report takes one report directory, got {len(args.run_dir)}; to join "
                         f"the report directories of --shard runs: report merge DIR... --out DIR")
    run_dir = Path(args.run_dir[0])
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a directory; pass the --report-dir of a run")
    from verify.store.report_dir import unfinished_run

    unfinished = unfinished_run(run_dir)
    if unfinished and not args.recompare:
        raise InputError(unfinished)
    target = Path(args.out) if args.out else run_dir
    check_report_target(target, "--out" if args.out else "the report directory")
    run_id = _run_id("recompare" if args.recompare else "report")
    record = load_record(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    if args.recompare:
        traces = run_dir / TRACES_DIR if (run_dir / TRACES_DIR).is_dir() else run_dir
        results = recompare(traces, read_tolerances(args.tolerances) if args.tolerances else None)
        results.options = dict(record.get("options", {}))
        record = run_record(results, run_id=run_id,
                            provenance={**record.get("provenance", {}),
                                        "recompared_from": str(traces),
                                        "original_run": record.get("run_id"),
                                        "tolerances": args.tolerances or "kept"})
    else:
        if args.tolerances:
            raise InputError("--tolerances applies with --recompare only (drift.csv.gz holds the "
                             "verdicts of the tolerances it was compared with)")
        results = read_report(run_dir)
        record = record or run_record(results, run_id=run_id)
    comparison = _comparison(args, record)
    with owned_report_dir(target, "--out" if args.out else "the report directory", run_id):
        written = write_report(target, results, record, comparison)
        record_report_files(target, written)   # (an older report's drift.csv gives way)
    for line in terminal_lines(results, written, comparison):
        print(line)
    for line in _run_failures(results):
        print(line)
    return 0 if results.verdict == "PASS" and (comparison is None or comparison.ok) else 1


def merge_command(args) -> int:
    """`report merge DIR... --out DIR`: one report, run record and history record of the
    shards (`verify.store.shard_merge`)."""
    from verify.store.history import write_record
    from verify.store.shard_merge import ShardMismatch, copy_repros, merge_shards

    directories = [Path(d) for d in args.run_dir[1:]]
    if not directories or not args.out:
        raise InputError("report merge needs the shards' report directories and --out DIR "
                         "(where the merged report goes)")
    if args.recompare or args.tolerances:
        raise InputError("report merge joins the shards' reports as written; --recompare and "
                         "--tolerances do not apply")
    out = Path(args.out)
    inside = [d for d in directories if out.resolve() == d.resolve()
              or out.resolve().is_relative_to(d.resolve())]
    if inside:
        raise InputError(f"--out {out} is the shard {inside[0]} (or inside it): the merged "
                         f"report would replace the shard's own; pass a new directory")
    check_report_target(out, "--out")
    try:
        results, provenance = merge_shards(directories)
    except ShardMismatch as e:
        raise InputError(str(e)) from None
    record = run_record(results, run_id=_run_id("merged"), provenance=provenance)
    comparison = _comparison(args, record)
    with owned_report_dir(out, "--out", record["run_id"]):
        written = write_report(out, results, record, comparison)
        record_report_files(out, written)
        written.append(write_record(out / "history", record))
        copy_repros(directories, out)
    for line in terminal_lines(results, written, comparison):
        print(line)
    return 0 if results.verdict == "PASS" and (comparison is None or comparison.ok) else 1


def check_report_target(target: Path, option: str) -> None:
    """Refuse, before any work, a report directory that cannot be written or holds report
    files no parity run wrote (a user's own summary.md is never replaced)."""
    from verify.store.report_dir import MANIFEST as REPORT_MANIFEST, foreign_report_files

    check_output_dir(target, option)
    foreign = foreign_report_files(target)
    if foreign:
        raise InputError(f"{option} {target} holds {', '.join(foreign)}, which no parity report "
                         f"wrote (its {REPORT_MANIFEST} does not list them): writing the report there "
                         f"would replace them; pass another {option}, or move them away")


@contextlib.contextmanager
def owned_report_dir(target: Path, option: str, run_id: str):
    """Write a report into `target` as a session does: holding its lock (refused while a
    running session holds it), checked again under the lock, written whole through ^C."""
    from verify.session.interruption import writes_whole
    from verify.store.report_dir import ReportDirBusy, ReportLock

    check_report_target(target, option)
    lock = ReportLock(target)
    try:
        lock.acquire(run_id)
    except ReportDirBusy as e:
        raise InputError(str(e)) from None
    try:
        with writes_whole():
            yield
    finally:
        lock.release()


def _run_failures(results: RunResults) -> list[str]:
    """Why each failing pair whose first divergence is a 'run' row failed (a side raised, or
    a kept trace could not be used): the terminal lines do not carry the message."""
    pairs = results.pairs
    failed = pairs[~pairs["verdict"].isin(GOOD) & (pairs["first_quantity"] == "run")]
    return [f"  why {pair_title(p)}: {clip(p.message, 600)}"
            for p in failed.itertuples(index=False)]


def _comparison(args, record: dict) -> RunComparison | None:
    if not args.compare_to:
        return None
    previous = load_record(args.compare_to, exclude_run_id=record.get("run_id"))
    if previous is None:
        print(f"{args.compare_to} holds no earlier run; nothing to compare with")
        return None
    return compare_runs(record, previous, args.regression_factor)


def _run_id(what: str) -> str:
    return f"{what}-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
