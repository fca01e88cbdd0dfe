"""`checkpoint convert`: carry a trained checkpoint from one implementation of a case into
another, through the case's name maps (nothing is written unless everything maps)."""
from __future__ import annotations

from verify.cli.arguments import InputError
from verify.core.files import read_json


def add_checkpoint_parser(commands) -> None:
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
    convert.set_defaults(run=checkpoint_convert_command)


def checkpoint_convert_command(args) -> int:
    """Convert SRC (written by --from) into DST (for --to); exit 2 listing every name that
    does not map, with nothing written."""
    from verify.runners.case_sources import CaseSourceError, load_cases, resolve_sources
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
