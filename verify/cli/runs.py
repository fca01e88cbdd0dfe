"""`run` and `serve`: what another process asks of this one (one implementation's run saved
as a trace; serving an environment pool's runs in another environment)."""
from __future__ import annotations

import sys
from pathlib import Path

from verify.cli.arguments import InputError


def add_run_parser(commands) -> None:
    run = commands.add_parser("run", help="run one implementation of a case and save its trace "
                                          "(what another process asks for)")
    run.add_argument("spec", help="a run spec: JSON with sources, case, implementation (and "
                                  "optionally steps, device, full, data_dir, replicas); '-' reads "
                                  "it from standard input")
    run.add_argument("--out", required=True, help="where to write the trace (<out>.json + .npz)")
    run.set_defaults(run=run_command)


def add_serve_parser(commands) -> None:
    serve = commands.add_parser("serve", help="serve runs for an environment pool (started by "
                                              "the suite in another environment; not for users)")
    serve.set_defaults(run=lambda args: serve_command())


def run_command(args) -> int:
    """Run what a RunSpec names and save the trace; exit 0 when the run did not raise."""
    from verify.runners.case_sources import CaseSourceError
    from verify.core.runner import RunSpec
    from verify.runners.case_sources import run_spec

    text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    try:
        trace = run_spec(RunSpec.from_json(text))
    except (CaseSourceError, KeyError) as e:
        raise InputError(str(e)) from None
    path = trace.save(Path(args.out))
    print(f"trace: {path} ({len(trace.values)} values"
          + (f"; the run raised: {trace.error}" if trace.error else "") + ")")
    return 0 if trace.error is None else 1


def serve_command() -> int:
    from verify.environments.pool import serve

    return serve()
