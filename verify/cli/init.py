"""`python -m verify init NAME --tf1 ... --keras ... --examples ...`: scaffold a case package
for a migration from its entry points (`verify.tools.case_scaffold`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from verify.cli.arguments import InputError, check_output_dir, positive_int


def add_init_parser(commands) -> None:
    parser = commands.add_parser(
        "init", help="scaffold a case package for a migration from its entry points, with the "
                     "name maps it can infer")
    parser.add_argument("name", help="the case's name, also its package's (e.g. my_migration)")
    parser.add_argument("--tf1", nargs="+", metavar="MODULE:FUNCTION",
                        help="the TF1 side: MODEL_FN INPUT_FN [EMBEDDING_CONFIG_SPEC]")
    parser.add_argument("--keras", nargs="+", metavar="MODULE:FUNCTION",
                        help="the Keras side: BUILD_MODEL DATASET_FN")
    parser.add_argument("--loop", nargs=1, metavar="MODULE:FUNCTION",
                        help="a custom loop: BUILD_LOOP (its one-device run is the reference "
                             "of a 2-replica MirroredStrategy run)")
    parser.add_argument("--examples", required=True, metavar="MODULE:FUNCTION",
                        help="a function returning the case's data as verify.Examples")
    parser.add_argument("--batch-size", type=positive_int, default=8,
                        help="global batch (default 8)")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="steps per run (default 20)")
    parser.add_argument("--out", default="cases", help="where the package goes (default cases/)")
    parser.set_defaults(run=init_command)


def init_command(args: argparse.Namespace) -> int:
    """Build the sides, infer the names, write the package; 0 when every name was decided,
    1 when the written maps carry guesses or undecided names to check."""
    from verify.tools.case_scaffold import (ScaffoldError, case_code, check_entry, check_target,
                                      infer, sides_of, write_package)
    from verify.tools.name_proposals import GUESSES
    from verify.runners.capture.devices import configure_cpu_replicas

    try:
        sides = sides_of(args.tf1, args.keras, args.loop)
        check_entry("--examples", args.examples)
        target = Path(args.out) / args.name
        check_target(target)   # before the sides are built
        check_output_dir(Path(args.out), "--out")
        configure_cpu_replicas()
        inferred = infer(sides, args.examples, args.batch_size)
        written = write_package(target, case_code(args.name, sides, args.examples, inferred,
                                                  args.batch_size, args.steps))
    except ScaffoldError as e:
        raise InputError(str(e)) from None
    print(f"wrote {written}: {len(inferred.shapes)} canonical names from {sides[0].name}")
    settled = True
    for name, proposal in inferred.proposals.items():
        guesses = [m for m in proposal.matches if m.how in GUESSES]
        undecided = [m.native for m in proposal.matches if not m.canonical]
        settled &= proposal.decided and not guesses
        print(f"  {name}: {len(proposal.matches) - len(undecided)} variables matched"
              + (f", {len(guesses)} by a guess to check" if guesses else "")
              + (f", undecided: {', '.join(undecided)}" if undecided else "")
              + (f", canonical names left: {', '.join(proposal.unmatched_canonical)}"
                 if proposal.unmatched_canonical else ""))
    print(f"next: check the maps (python -m verify names {args.name} --cases {args.out}), "
          f"measure the noise floors (python -m verify calibrate {args.name} --cases "
          f"{args.out} --out {target / 'calibration.json'}), then python -m verify suite "
          f"--cases {args.out}")
    return 0 if settled else 1
