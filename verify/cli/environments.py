"""`envs list|create|remove`: the environments implementations run in, as the project's
pyproject.toml declares them ([tool.parity.environments])."""
from __future__ import annotations

import sys
from pathlib import Path

from verify.cli.arguments import InputError


def add_envs_parser(commands) -> None:
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
        sub.set_defaults(run=envs_command, action=action)


def envs_command(args) -> int:
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
