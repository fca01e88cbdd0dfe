"""`calibrate`: measure a case's noise floors (its references run plainly and nudged by one
ulp), write its calibration.json, and say where the case's own tolerances sit below them."""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path

from verify.cli.arguments import InputError, check_output_file, positive_int
from verify.core.quantities import NUMERIC


def add_calibrate_parser(commands) -> None:
    calibrate = commands.add_parser(
        "calibrate", help="measure a case's noise floors and write its calibration.json")
    calibrate.add_argument("case", help="the case's name")
    calibrate.add_argument("--cases", action="append", default=None,
                           help="where cases come from (repeatable; default cases/)")
    calibrate.add_argument("--steps", type=positive_int, default=None,
                           help="steps to measure (default: the case's own)")
    calibrate.add_argument("--references", default=None,
                           help="comma-separated references to calibrate (default: every "
                                "pair's reference, the case's float32 reference for the "
                                "oracle's pairs; never a candidate as such)")
    calibrate.add_argument("--full", action="store_true",
                           help="the case's long tier, as `pytest verify/ --full` runs it "
                                "(its own calibration_file, when the case declares one)")
    calibrate.add_argument("--out", help="where to write (default: the case's calibration_file; "
                                         "with --tpu, beside it: calibration_tpu.json)")
    calibrate.add_argument("--tpu", action="store_true",
                           help="measure on the TPU (a pytest verify/ --tpu run is judged with "
                                "it; a CPU calibration is never applied there); fails at once "
                                "when no TPU is reachable")
    calibrate.add_argument("--tpu-name", default="", help="TPU name or grpc address ('' = local)")
    calibrate.add_argument("--headroom", action="store_true",
                           help="also run every pair and print how far it sits above its "
                                "floor (information only: it sets no tolerance)")
    calibrate.add_argument("--merge", action="store_true",
                           help="add the measured references to the calibration already at "
                                "the output path instead of replacing it (the file is locked "
                                "meanwhile: concurrent merges wait for each other)")
    calibrate.add_argument("--force", action="store_true",
                           help="replace a file at the output path that is not a calibration "
                                "of this case (without it, such a file is refused)")
    calibrate.set_defaults(run=calibrate_command)


def calibrate_command(args) -> int:
    """Run the case's references plainly and nudged by one ulp; write their noise floors; say
    where the case's own tolerances sit below its multiple of them."""
    from verify.tools.calibration import (ReferenceRaised, calibrate_case, ceiling_advice,
                                    pair_headroom)
    from verify.session.interruption import writes_whole
    from verify.runners.capture.devices import (MAX_CPU_REPLICAS, TpuUnavailable,
                                                configure_cpu_replicas, resolve_tpu)

    device = "tpu" if args.tpu else "cpu"
    if args.tpu:
        try:
            resolve_tpu(args.tpu_name)
        except TpuUnavailable as e:
            raise InputError(f"calibrate --tpu: {e}") from None
    else:
        configure_cpu_replicas(MAX_CPU_REPLICAS)
    case, out, references = _calibration_target(args, device)
    _check_replaceable(out, case, args)   # before anything is measured
    plains: dict = {}
    try:
        calibration = calibrate_case(case, references=references, steps=args.steps,
                                     device=device, tpu_name=args.tpu_name, plains=plains)
    except ReferenceRaised as e:
        raise InputError(str(e)) from None
    if not calibration.references:
        raise InputError(f"case {case.name}: no reference was calibrated (none is a pair's "
                         f"reference here, or each runs in another environment; see the lines "
                         f"above), so nothing is written; name them with --references")
    with _locked(out, args.merge), writes_whole():
        if args.merge:
            calibration = _merged_with_existing(calibration, out)
        calibration.save(out)
    multiple = case.tolerance_multiple
    print(f"calibration: {out} ({len(calibration.references)} references, "
          f"{calibration.steps} steps); calibrated tolerances are {multiple:g}x the floor"
          + (f" ({case.tolerance_multiple_why})" if case.tolerance_multiple_why else ""))
    _print_floors(calibration)
    advice = ceiling_advice(case, calibration, plains)
    if advice:
        print(f"the case's own tolerances below {multiple:g}x the floor (the lower one judges):")
        for item in advice:
            print(f"  {item.line(multiple)}")
    if args.headroom:
        print("each pair's worst drift in floors (information: it sets no tolerance):")
        for found in pair_headroom(case, calibration, steps=args.steps, device=device):
            print(f"  {found.reference} -> {found.candidate} ({found.role}): "
                  f"{found.times_floor:.3g}x at {found.where}")
    below = [item for item in advice if item.below_floor]
    if below:
        print(f"error: {len(below)} of the case's tolerances are below the measured floor, "
              f"so every row they judge fails as float noise: raise them as above",
              file=sys.stderr)
        return 1
    return 0


def _calibration_target(args, device: str = "cpu"):
    """The case to calibrate (its tier as --full asks), where its calibration goes, and the
    references --references names (None: the case's own choice)."""
    from verify.runners.case_sources import CaseSourceError, load_cases, resolve_sources
    from verify.core.case import SuiteOptions

    try:
        case = load_cases(resolve_sources(args.cases or ["cases"]),
                          SuiteOptions(full=args.full), [args.case])[args.case]
    except CaseSourceError as e:
        raise InputError(str(e)) from None
    out = Path(args.out) if args.out else case.calibration_path(device)
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
    return case, out, references


def _check_replaceable(out: Path, case, args) -> None:
    """Refuse, before measuring, an output path that cannot be written, or that holds a file
    this command would replace though it is not a calibration of this case (unless --force);
    --merge needs a calibration of this case there, or nothing."""
    from verify.core.noise_floor import Calibration

    check_output_file(out, "--out")
    if not out.exists():
        return
    try:
        existing = Calibration.load(out)
        why = None if existing.case == case.name else f"the calibration of case {existing.case}"
        steps = args.steps or case.steps
        if not why and args.merge and (existing.steps, existing.data_digest) != (
                steps, case.data_digest()):
            why = (f"a calibration of {existing.steps} steps and data {existing.data_digest} "
                   f"(this run: {steps} steps, data {case.data_digest()})")
    except (ValueError, OSError) as e:
        why = f"not a calibration ({e})"
    if why and (args.merge or not args.force):
        raise InputError(f"--out {out} holds {why}: "
                         + ("--merge adds to a calibration of this case, steps and data only "
                            "(calibrate every reference again without --merge)" if args.merge
                            else "pass another --out, or --force to replace it"))


@contextlib.contextmanager
def _locked(out: Path, merge: bool):
    """With --merge, an exclusive lock (`<out>.lock`, flock) from reading the calibration at
    `out` to writing it back: two merges into one file never lose a reference."""
    if not merge:
        yield
        return
    fd = os.open(f"{out}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # waits for a merge under way
        yield
    finally:
        os.close(fd)


def _merged_with_existing(calibration, out: Path):
    """--merge: the measured references added to the calibration already at `out`."""
    from verify.tools.calibration import merge_calibrations
    from verify.core.noise_floor import Calibration

    try:
        existing = Calibration.load(out)
        return merge_calibrations(existing, calibration) if existing else calibration
    except ValueError as e:
        raise InputError(f"--merge: {e}") from None


def _print_floors(calibration) -> None:
    """Each reference's floor per quantity, at step 1 and at the last step."""
    for reference, floor in sorted(calibration.references.items()):
        for quantity in NUMERIC:
            series = [v for (q, _), v in floor.floors.items() if q == quantity]
            if series:
                first = max(v[min(1, len(v) - 1)] for v in series)
                last = max(v[-1] for v in series)
                print(f"  {reference:<28} {quantity:<7} floor step 1 {first:.3g}, "
                      f"last step {last:.3g}")
