"""`python -m verify doctor [--tpu] [--out DIR]`: the capture's mechanisms checked on this
device, one line each, and a bundle for a bug report (`verify.tools.doctor`)."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def add_doctor_parser(commands) -> None:
    from verify.tools.doctor import CHECKS

    parser = commands.add_parser(
        "doctor", help="check every mechanism the capture relies on, on this device (--tpu: "
                       "the TPU), one line each; write doctor.json and doctor.txt to attach "
                       "to a bug report")
    parser.add_argument("--tpu", action="store_true",
                        help="check on the TPU (fails at once, saying why, when none is "
                             "reachable); without it the CPU stand-ins run")
    parser.add_argument("--tpu-name", default="", help="TPU name or grpc address ('' = local)")
    parser.add_argument("--out", default="doctor", type=Path,
                        help="where the bundle is written (default ./doctor/)")
    parser.add_argument("--check", action="append", choices=[c.name for c in CHECKS],
                        dest="checks", help="run only this check (repeatable; default all)")
    parser.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """Run the checks, print a line each and where the bundle is; 0 when every check passed."""
    from verify.cli.arguments import check_output_dir
    from verify.tools.doctor import CHECKS, Setting, run_checks, write_bundle
    from verify.session.interruption import writes_whole

    check_output_dir(args.out, "--out")   # before the checks, not after them
    checks = tuple(c for c in CHECKS if not args.checks or c.name in args.checks)
    with tempfile.TemporaryDirectory(prefix="parity-doctor-") as workdir:
        setting = Setting("tpu" if args.tpu else "cpu", args.tpu_name, Path(workdir))
        results = run_checks(setting, checks)
    for result in results:
        print(result.line())
    with writes_whole():
        bundle = write_bundle(args.out, setting, results)
    failed = [r.name for r in results if r.status != "pass"]
    print(f"doctor: {'FAIL' if failed else 'PASS'}"
          + (f" ({', '.join(failed)})" if failed else "")
          + ("" if args.tpu else " on CPU stand-ins (no --tpu)")
          + f"; bundle: {bundle.parent}/ (doctor.json, doctor.txt)")
    return 1 if failed else 0
