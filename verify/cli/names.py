"""`python -m verify names CASE [IMPLEMENTATION]`: each side's variables, read by its runner
without training, against the case's canonical names, and the name map that can be inferred
(`verify.tools.name_proposals`)."""
from __future__ import annotations

import argparse

from verify.cli.arguments import InputError


def add_names_parser(commands) -> None:
    parser = commands.add_parser(
        "names", help="print an implementation's variables and the name map to the case's "
                      "canonical names that can be inferred (shape, creation order)")
    parser.add_argument("case", help="the case's name")
    parser.add_argument("implementation", nargs="?",
                        help="one implementation (default: every one)")
    parser.add_argument("--cases", action="append", default=None,
                        help="where cases come from (repeatable; default cases/)")
    parser.set_defaults(run=names_command)


def names_command(args: argparse.Namespace) -> int:
    """Print, per implementation, its variables with how each was matched, and the proposed
    `NameMap`; 0 when every side's variables and canonical names are all matched."""
    from verify.runners.case_sources import CaseSourceError, load_cases, resolve_sources
    from verify.core.case import SuiteOptions
    from verify.core.meta import current_environment
    from verify.tools.name_proposals import propose
    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas()
    try:
        case = load_cases(resolve_sources(args.cases or ["cases"]), SuiteOptions(),
                          [args.case])[args.case]
    except CaseSourceError as e:
        raise InputError(str(e)) from None
    known = [i.name for i in case.implementations]
    if args.implementation and args.implementation not in known:
        raise InputError(f"case {case.name} has no implementation {args.implementation!r}; "
                         f"its implementations are {known}")
    undecided = 0
    canonical = case.canonical_shapes()
    print(f"case {case.name}: canonical names (from its initial values): "
          + ", ".join(f"{n} {tuple(s)}" for n, s in canonical.items()))
    for implementation in case.implementations:
        if args.implementation and implementation.name != args.implementation:
            continue
        if implementation.environment != current_environment():
            print(f"\n{implementation.name}: runs in environment "
                  f"{implementation.environment!r}; its variables are read there only (not "
                  f"listed)")
            continue
        reader = getattr(implementation.runner, "native_variables", None)
        if reader is None or implementation.mutation is not None:
            print(f"\n{implementation.name}: its runner cannot list its variables here "
                  f"({type(implementation.runner).__name__})")
            continue
        try:
            native = reader(case, implementation)
        except Exception as e:  # noqa: BLE001 - one side that cannot be built says why
            print(f"\n{implementation.name}: building it failed: {type(e).__name__}: {e}")
            undecided += 1
            continue
        proposal = propose(native, canonical, implementation.names)
        undecided += not proposal.decided
        print(f"\n{implementation.name} ({len(native)} variables, trainable or not, creation "
              f"order):")
        for m in proposal.matches:
            dtype = native[m.native][1]
            target = f"-> {m.canonical}" + (" (transposed)" if m.transpose else "") \
                if m.canonical else "-> ?"
            print(f"  {m.native} {m.shape} {dtype} {target}  [{m.how}]")
        print("proposed name map:\n" + proposal.name_map_code())
    return 1 if undecided else 0
