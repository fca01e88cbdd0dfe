"""`python -m verify`: re-compare kept traces and re-render reports, without TensorFlow.

    python -m verify compare reports/traces/tpu_embedding/tf1 reports/traces/tpu_embedding/tf2
    python -m verify report reports/                     # re-render summary.md and report.html
    python -m verify report reports/ --recompare --out /tmp/again   # from kept traces
    python -m verify history list reports/history
    python -m verify history compare reports/history     # latest run against the one before
    python -m verify run spec.json --out traces/tf2      # run one implementation (a worker)
    python -m verify suite --cases parity_cases -n 2     # the installed parity suite (pytest)
    python -m verify envs list                           # declared environments, built or not
    python -m verify envs create tf221                   # build one now (else: on first use)
    python -m verify checkpoint convert --case tpu_embedding --from tf1 --to tf2 SRC DST

`suite` passes its arguments to pytest and exits with pytest's status (see verify/suite.py).
The other commands exit with 0 when everything passed (and nothing regressed), 1 when a pair
failed or a run regressed, 2 for bad input (a message says what is wrong), 3 when the suite
itself failed (a traceback; no verdict was reached).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
import traceback
from pathlib import Path

from verify.core.case import PairSpec
from verify.core.files import BadFile, read_json
from verify.history import (DEFAULT_FACTOR, RunComparison, compare_runs, history, load_record,
                            run_record)
from verify.judge import judge_pair, unjudged
from verify.judge.verdict import GOOD
from verify.kept_traces import (MANIFEST, TRACES_DIR, KeptTraces, check_beside_manifest,
                                load_trace, manifest_calibration, read_manifest,
                                read_tolerances, recompare, trace_stem)
from verify.render import write_report
from verify.render.html import worst_tensors
from verify.render.text import clip
from verify.render.terminal import comparison_terminal_lines, terminal_lines
from verify.results import RunResults, pair_title, read_report
from verify.sensitivity import base_candidate, is_mutant, resolve_spec


class InputError(Exception):
    """Bad input from the command line: printed as `error: ...`, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["suite"]:   # every argument is pytest's: argparse must not read them
        from verify.suite import run_suite

        return run_suite(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (InputError, BadFile, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - a crash must not read as a verdict (exit 1)
        traceback.print_exc()
        print("internal error: the suite itself failed (traceback above); no verdict was "
              "reached", file=sys.stderr)
        return 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    compare = commands.add_parser("compare", help="compare two saved traces")
    compare.add_argument("reference", help="reference trace (.json, .npz or their stem)")
    compare.add_argument("candidate", help="candidate trace (.json, .npz or their stem)")
    compare.add_argument("--tolerances", help=f"a {MANIFEST} or tolerances JSON (default: the "
                                              f"{MANIFEST} kept beside the reference trace)")
    compare.add_argument("--out", help="also write a report of this pair into this directory")
    compare.set_defaults(run=_compare)

    report = commands.add_parser("report", help="re-render a report directory")
    report.add_argument("run_dir", help="a report directory (drift.csv, summary.csv, run.json)")
    report.add_argument("--recompare", action="store_true",
                        help=f"compare the kept traces ({TRACES_DIR}/) again instead of reading "
                             f"drift.csv")
    report.add_argument("--tolerances", help="with --recompare: tolerances for every case")
    report.add_argument("--out", help="where to write (default: run_dir)")
    _comparison_arguments(report)
    report.set_defaults(run=_report)

    run = commands.add_parser("run", help="run one implementation of a case and save its trace "
                                          "(what another process asks a worker for)")
    run.add_argument("spec", help="a run spec: JSON with sources, case, implementation (and "
                                  "optionally steps, device, full, data_dir, replicas); '-' reads "
                                  "it from standard input")
    run.add_argument("--out", required=True, help="where to write the trace (<out>.json + .npz)")
    run.set_defaults(run=_run)

    calibrate = commands.add_parser(
        "calibrate", help="measure a case's noise floors and write its calibration.json")
    calibrate.add_argument("case", help="the case's name")
    calibrate.add_argument("--cases", action="append", default=None,
                           help="where cases come from (repeatable; default cases/)")
    calibrate.add_argument("--steps", type=int, default=None,
                           help="steps to measure (default: the case's own)")
    calibrate.add_argument("--references", default=None,
                           help="comma-separated references to calibrate (default: every "
                                "pair's reference, the case's float32 reference for the "
                                "oracle's pairs; never a candidate as such)")
    calibrate.add_argument("--full", action="store_true",
                           help="the case's long tier, as `pytest verify/ --full` runs it "
                                "(its own calibration_file, when the case declares one)")
    calibrate.add_argument("--out", help="where to write (default: the case's calibration_file)")
    calibrate.add_argument("--headroom", action="store_true",
                           help="also run every pair and print how far it sits above its "
                                "floor (information only: it sets no tolerance)")
    calibrate.add_argument("--merge", action="store_true",
                           help="add the measured references to the calibration already at "
                                "the output path instead of replacing it")
    calibrate.set_defaults(run=_calibrate)

    envs = commands.add_parser("envs", help="the environments implementations run in "
                                            "([tool.parity.environments] in pyproject.toml)")
    envs_commands = envs.add_subparsers(required=True, metavar="ACTION")
    for action, helptext in (("list", "each declared environment and whether it is built"),
                             ("create", "build environments now (default: every declared one)"),
                             ("remove", "delete built environments (default: every declared one)")):
        sub = envs_commands.add_parser(action, help=helptext)
        if action != "list":
            sub.add_argument("names", nargs="*", help="environment names")
        sub.add_argument("--project", default="pyproject.toml",
                         help="the pyproject.toml that declares them (default: ./pyproject.toml)")
        sub.set_defaults(run=_envs, action=action)

    worker = commands.add_parser("worker", help="serve runs for a worker pool (started by the "
                                                "suite in another environment; not for users)")
    worker.set_defaults(run=lambda args: _worker())

    commands.add_parser("suite", add_help=False,
                        help="run the installed parity suite from the working directory: "
                             "python -m verify suite [--cases PATH] [--report-dir DIR] "
                             "[pytest options] (see python -m verify suite --help)")

    checkpoint = commands.add_parser("checkpoint", help="carry a trained checkpoint from one "
                                                        "implementation of a case into another")
    checkpoint_commands = checkpoint.add_subparsers(required=True, metavar="ACTION")
    convert = checkpoint_commands.add_parser(
        "convert", help="convert a TF1 checkpoint into the TF2 model's tf.train.Checkpoint "
                        "through the case's name maps (tables, dense variables, optimizer "
                        "slots, step); nothing is written unless everything maps")
    convert.add_argument("--case", required=True, help="the case whose name maps to use")
    convert.add_argument("--from", dest="source", required=True,
                         help="the implementation that wrote SRC (e.g. tf1)")
    convert.add_argument("--to", dest="target", required=True,
                         help="the implementation to restore DST (e.g. tf2)")
    convert.add_argument("--cases", action="append", default=None,
                         help="where cases come from (repeatable; default cases/)")
    convert.add_argument("src", help="the source checkpoint: a model_dir or a checkpoint prefix")
    convert.add_argument("dst", help="a new directory for the converted checkpoint")
    convert.set_defaults(run=_checkpoint_convert)

    hist = commands.add_parser("history", help="list or compare run records")
    hist_commands = hist.add_subparsers(required=True, metavar="ACTION")
    listing = hist_commands.add_parser("list", help="one line per recorded run")
    listing.add_argument("history_dir")
    listing.set_defaults(run=_history_list)
    versus = hist_commands.add_parser("compare", help="regressions of a run since another")
    versus.add_argument("current", help="a run record, report directory or history directory "
                                        "(its latest run)")
    versus.add_argument("previous", nargs="?", help="the run to compare with (default: the run "
                                                    "before `current` in its history directory)")
    _factor_argument(versus)
    versus.set_defaults(run=_history_compare)
    return parser


def _comparison_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compare-to", help="a previous run record, report directory or "
                                             "history directory: report regressions since it")
    _factor_argument(parser)


def _factor_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regression-factor", type=float, default=DEFAULT_FACTOR,
                        help=f"worst drift growth that counts as a regression "
                             f"(default {DEFAULT_FACTOR:g})")


def _compare(args) -> int:
    """Judge two kept traces as the run that kept them did (`judge_pair`): numbers, preflight
    from what each side declared, and attribution when the case's oracle trace is beside them.
    A trace that is not what the case.json beside it stores there fails the pair, saying why."""
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
        result = judge_pair(spec, lambda name: given.get(name) or kept(name), tolerances,
                            calibration=calibration)
    print(f"{result.verdict.status}: {pair_title(result.record)}: {result.verdict.message}")
    print(f"preflight: {result.record.preflight}")
    if result.record.attribution:
        print(f"attribution: {result.record.attribution}")
    worst = worst_tensors(result.rows)
    if not worst.empty and not problems:
        print(worst.drop(columns="reason").to_string(index=False))
    if args.out:
        results = RunResults.of([result])
        record = run_record(results, run_id=_run_id("compare"),
                            provenance={"traces": [str(args.reference), str(args.candidate)]})
        written = write_report(Path(args.out), results, record)
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


def _run(args) -> int:
    """Run what a RunSpec names and save the trace; exit 0 when the run did not raise."""
    from verify.case_sources import CaseSourceError
    from verify.core.runner import RunSpec
    from verify.case_sources import run_spec

    text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    try:
        trace = run_spec(RunSpec.from_json(text))
    except (CaseSourceError, KeyError) as e:
        raise InputError(str(e)) from None
    path = trace.save(Path(args.out))
    print(f"trace: {path} ({len(trace.values)} values"
          + (f"; the run raised: {trace.error}" if trace.error else "") + ")")
    return 0 if trace.error is None else 1


def _envs(args) -> int:
    """List, build or remove the declared environments."""
    from verify.environments import declared as envs

    declared = envs.declared_environments(Path(args.project))
    names = getattr(args, "names", None) or sorted(declared)
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise InputError(f"{args.project} declares no environment {', '.join(unknown)}; "
                         f"declared: {', '.join(sorted(declared)) or 'none'}")
    cache = envs.default_cache()
    if args.action == "list":
        print(f"environments declared in {args.project}, built under {cache} (PARITY_ENV_DIR):")
        print(f"  {envs.SUITE_ENVIRONMENT:12} the suite's own (this Python, {sys.executable})")
        for name in names:
            env = declared[name]
            stamp = envs.stamp_of(env, cache)
            state = (f"built {stamp['built']} in {stamp['seconds']:g} s"
                     if stamp else "not built (built on first use)")
            print(f"  {name:12} {env.description or ', '.join(env.requirements)}\n"
                  f"  {'':12} {env.directory(cache)}: {state}")
        return 0
    status = 0
    for name in names:
        if args.action == "create":
            try:
                built = envs.ensure(declared[name], cache)
            except envs.EnvironmentUnavailable as e:
                print(f"error: {e}", file=sys.stderr)
                status = 1
                continue
            print(f"{name}: {built.directory}" + ("" if built.built_now else " (already built)"))
        else:
            removed = envs.remove(declared[name], cache)
            print(f"{name}: " + (f"removed {removed}" if removed else "was not built"))
    return status


def _worker() -> int:
    from verify.environments.pool import serve

    return serve()


def _calibrate(args) -> int:
    """Run the case's references plainly and nudged by one ulp; write their noise floors; say
    where the case's own tolerances sit below its multiple of them."""
    from verify.calibration import calibrate_case, ceiling_advice, pair_headroom
    from verify.case_sources import CaseSourceError, load_cases, resolve_sources
    from verify.core.case import SuiteOptions
    from verify.runners.capture.devices import MAX_CPU_REPLICAS, configure_cpu_replicas

    configure_cpu_replicas(MAX_CPU_REPLICAS)
    try:
        case = load_cases(resolve_sources(args.cases or ["cases"]),
                          SuiteOptions(full=args.full), [args.case])[args.case]
    except CaseSourceError as e:
        raise InputError(str(e)) from None
    out = Path(args.out) if args.out else case.calibration_file
    if out is None:
        raise InputError(f"case {case.name} declares no calibration_file; add "
                         f"calibration_file=Path(__file__).with_name('calibration.json') to its "
                         f"Case, or pass --out PATH")
    references = args.references.split(",") if args.references else None
    known = [i.name for i in case.implementations]
    for name in references or ():
        if name not in known:
            raise InputError(f"--references: case {case.name} has no implementation {name!r}; "
                             f"its implementations are {known}")
    plains: dict = {}
    calibration = calibrate_case(case, references=references, steps=args.steps, plains=plains)
    if args.merge:
        from verify.calibration import merge_calibrations
        from verify.core.noise_floor import Calibration

        try:
            existing = Calibration.load(out)
            calibration = merge_calibrations(existing, calibration) if existing else calibration
        except ValueError as e:
            raise InputError(f"--merge: {e}") from None
    calibration.save(out)
    multiple = case.tolerance_multiple
    print(f"calibration: {out} ({len(calibration.references)} references, "
          f"{calibration.steps} steps); calibrated tolerances are {multiple:g}x the floor"
          + (f" ({case.tolerance_multiple_why})" if case.tolerance_multiple_why else ""))
    for reference, floor in sorted(calibration.references.items()):
        for quantity in ("loss", "grad", "slot", "weight", "metric"):
            series = [v for (q, _), v in floor.floors.items() if q == quantity]
            if series:
                first = max(v[min(1, len(v) - 1)] for v in series)
                last = max(v[-1] for v in series)
                print(f"  {reference:<28} {quantity:<7} floor step 1 {first:.3g}, "
                      f"last step {last:.3g}")
    advice = ceiling_advice(case, calibration, plains)
    if advice:
        print(f"the case's own tolerances below {multiple:g}x the floor (the lower one judges):")
        for item in advice:
            print(f"  {item.line(multiple)}")
    if args.headroom:
        print("each pair's worst drift in floors (information: it sets no tolerance):")
        for found in pair_headroom(case, calibration, steps=args.steps):
            print(f"  {found.reference} -> {found.candidate} ({found.role}): "
                  f"{found.times_floor:.3g}x at {found.where}")
    below = [item for item in advice if item.below_floor]
    if below:
        print(f"error: {len(below)} of the case's tolerances are below the measured floor, "
              f"so every row they judge fails as float noise: raise them as above",
              file=sys.stderr)
        return 1
    return 0


def _checkpoint_convert(args) -> int:
    """Convert SRC (written by --from) into DST (for --to); exit 2 listing every name that
    does not map, with nothing written."""
    from verify.case_sources import CaseSourceError, load_cases, resolve_sources
    from verify.checkpoint import convert_checkpoint
    from verify.core.case import SuiteOptions

    try:
        case = load_cases(resolve_sources(args.cases or ["cases"]),
                          SuiteOptions(), [args.case])[args.case]
    except CaseSourceError as e:
        raise InputError(str(e)) from None
    known = [i.name for i in case.implementations]
    for name in (args.source, args.target):
        if name not in known:
            raise InputError(f"case {case.name} has no implementation {name!r}; its "
                             f"implementations are {known}")
    source, target = case.implementation(args.source), case.implementation(args.target)
    try:
        dst = convert_checkpoint(case, source, target, args.src, args.dst)
    except OSError as e:
        raise InputError(f"checkpoint convert: cannot write {args.dst} ({e.strerror or e}"
                         + (f": {e.filename}" if e.filename else "") + "); pass a DST "
                         "directory that can be created and written") from None

    manifest = read_json(dst / "conversion.json", "convert again")
    print(f"checkpoint: {dst} ({case.name}: {source.name} -> {target.name}, step "
          f"{manifest['step']}, {len(manifest['carried'])} values carried)")
    return 0


def _report(args) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a directory; pass the --report-dir of a run")
    from verify.report_dir import unfinished_run

    unfinished = unfinished_run(run_dir)
    if unfinished and not args.recompare:
        raise InputError(unfinished)
    record = load_record(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    if args.recompare:
        traces = run_dir / TRACES_DIR if (run_dir / TRACES_DIR).is_dir() else run_dir
        results = recompare(traces, read_tolerances(args.tolerances) if args.tolerances else None)
        results.options = dict(record.get("options", {}))
        record = run_record(results, run_id=_run_id("recompare"),
                            provenance={**record.get("provenance", {}),
                                        "recompared_from": str(traces),
                                        "original_run": record.get("run_id"),
                                        "tolerances": args.tolerances or "kept"})
    else:
        if args.tolerances:
            raise InputError("--tolerances applies with --recompare only (drift.csv holds the "
                             "verdicts of the tolerances it was compared with)")
        results = read_report(run_dir)
        record = record or run_record(results, run_id=_run_id("report"))
    comparison = _comparison(args, record)
    written = write_report(Path(args.out) if args.out else run_dir, results, record, comparison)
    for line in terminal_lines(results, written, comparison):
        print(line)
    for line in _run_failures(results):
        print(line)
    return 0 if results.verdict == "PASS" and (comparison is None or comparison.ok) else 1


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


def _history_list(args) -> int:
    records = history(Path(args.history_dir))
    if not records:
        raise InputError(f"{args.history_dir} holds no run records (history/<run>.json)")
    print(f"{'run':<24} {'time':<26} {'commit':<12} {'verdict':<8} {'pairs':>5}  "
          f"worst max abs (loss / grad / weight)")
    for r in records:
        worst = {w["quantity"]: w["max_abs"] for w in r.get("worst", [])}
        drift = " / ".join(f"{worst[q]:.2g}" if q in worst else "-"
                           for q in ("loss", "grad", "weight"))
        commit = (r.get("provenance", {}).get("git_commit") or "-")[:10]
        print(f"{r['run_id']:<24} {r.get('timestamp', '?'):<26} {commit:<12} "
              f"{r['verdict']:<8} {len(r.get('pairs', [])):>5}  {drift}")
    return 0


def _history_compare(args) -> int:
    current_path = Path(args.current)
    if args.previous:
        current, previous = load_record(current_path), load_record(args.previous)
    elif current_path.is_dir() and not (current_path / "run.json").is_file():
        records = history(current_path)
        if len(records) < 2:
            raise InputError(f"{current_path} holds {len(records)} run record(s); comparing "
                             f"needs two (or pass PREVIOUS)")
        current, previous = records[-1], records[-2]
    else:
        current = load_record(current_path)
        folder = current_path.parent if current_path.is_file() else current_path / "history"
        earlier = [r for r in history(folder) if r.get("timestamp", "") < current["timestamp"]
                   and r.get("run_id") != current.get("run_id")] if folder.is_dir() else []
        if not earlier:
            raise InputError(f"no run before {current['run_id']} in {folder}; pass PREVIOUS")
        previous = earlier[-1]
    if current is None or previous is None:
        raise InputError("no run record found to compare")
    comparison = compare_runs(current, previous, args.regression_factor)
    print(f"run {current.get('run_id')} ({current.get('verdict')})")
    for line in comparison_terminal_lines(comparison):
        print(line)
    return 0 if comparison.ok else 1


def _run_id(what: str) -> str:
    return f"{what}-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


if __name__ == "__main__":
    sys.exit(main())
