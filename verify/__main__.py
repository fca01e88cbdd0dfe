"""`python -m verify`: scaffold, calibrate and run the parity suite, re-compare kept traces and
re-render reports (`report`, `compare`, `history` and `envs` need no TensorFlow).

    python -m verify compare reports/traces/tpu_embedding/tf1 reports/traces/tpu_embedding/tf2
    python -m verify report reports/                     # re-render summary.md and report.html
    python -m verify report reports/ --recompare --out /tmp/again   # from kept traces
    python -m verify history list reports/history
    python -m verify history compare reports/history     # latest run against the one before
    python -m verify run spec.json --out traces/tf2      # run one implementation (a child process)
    python -m verify suite --cases parity_cases -n 2     # the installed parity suite (pytest)
    python -m verify envs list                           # declared environments, built or not
    python -m verify envs create tf221                   # build one now (else: on first use)
    python -m verify checkpoint convert --case tpu_embedding --from tf1 --to tf2 SRC DST
    python -m verify doctor [--tpu]                      # the capture's mechanisms, here
    python -m verify names tpu_embedding tf2             # a side's variables, a name map
    python -m verify repro reports/                      # the report's standalone repros
    python -m verify init my_migration --tf1 M:model_fn M:input_fn --keras N:build_model \
        N:dataset_fn --examples D:examples               # scaffold a case package

`suite` passes its arguments to pytest and exits with pytest's status (see verify/session/suite.py).
The other commands exit with 0 when everything passed (and nothing regressed), 1 when a pair
failed or a run regressed, 2 for bad input or an exception raised by the user's own code (a
message says what is wrong and, for the user's code, where), 3 when the suite itself failed (a
traceback; no verdict was reached), 130 when interrupted (^C or SIGTERM; one line, and every
file a command writes is written whole or not at all).
"""
from __future__ import annotations

import argparse
import sys
import traceback

from verify.cli.arguments import InputError
from verify.cli.calibrate import add_calibrate_parser
from verify.cli.checkpoint import add_checkpoint_parser
from verify.cli.doctor import add_doctor_parser
from verify.cli.init import add_init_parser
from verify.cli.names import add_names_parser
from verify.cli.environments import add_envs_parser
from verify.cli.reports import add_compare_parser, add_report_parser
from verify.cli.repro import add_repro_parser
from verify.cli.run_history import add_history_parser
from verify.cli.runs import add_run_parser, add_serve_parser
from verify.core.files import BadFile
from verify.core.user_code import user_error
from verify.session.interruption import Interruption


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["suite"]:   # every argument is pytest's: argparse must not read them
        from verify.session.suite import run_suite

        return run_suite(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)   # bad arguments: argparse's message, exit 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    stopping = Interruption()   # SIGTERM too ends a command as ^C does
    stopping.install()
    try:
        return args.run(args)
    except (InputError, BadFile, FileNotFoundError, ValueError) as e:
        print(f"error: {user_error(e) or e}", file=sys.stderr)
        return 2
    except SystemExit as e:   # sys.exit() in the user's module or function
        users = user_error(e)
        if users is None:
            raise
        print(f"error: {users}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {argv[0]} stopped ({stopping.first or 'SIGINT'}); every file it "
              f"writes is written whole or not at all", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a crash must not read as a verdict (exit 1)
        users = user_error(e)
        if users:
            print(f"error: {users}", file=sys.stderr)
            return 2
        traceback.print_exc()
        print("internal error: the suite itself failed (traceback above); no verdict was "
              "reached", file=sys.stderr)
        return 3
    finally:
        stopping.uninstall()


def build_parser() -> argparse.ArgumentParser:
    """The commands, in the order the help lists them; each family's module (verify/cli/)
    adds its own parsers and the function each command runs."""
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    add_compare_parser(commands)
    add_report_parser(commands)
    add_run_parser(commands)
    add_calibrate_parser(commands)
    add_envs_parser(commands)
    add_serve_parser(commands)
    commands.add_parser("suite", add_help=False,
                        help="run the installed parity suite from the working directory: "
                             "python -m verify suite [--cases PATH] [--report-dir DIR] "
                             "[pytest options] (see python -m verify suite --help)")
    add_checkpoint_parser(commands)
    add_history_parser(commands)
    add_doctor_parser(commands)
    add_names_parser(commands)
    add_repro_parser(commands)
    add_init_parser(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
