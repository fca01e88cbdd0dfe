"""MkDocs hook: put every `python -m verify` command's `--help` into the command-line page, from
the parser itself, so the page never drifts from the code. Commands appear in the order a user
meets them (`ORDER`); the internal `worker` command is left out."""
from __future__ import annotations

import contextlib
import io
import os

MARKER = "<!-- cli-help -->"
# The order of a first migration: scaffold, check the names, calibrate, run, read; then the rest.
ORDER = ("init", "names", "calibrate", "suite", "report", "repro", "compare", "history", "doctor",
         "envs", "checkpoint", "run")
INTERNAL = {"worker"}   # started by the suite in another environment, never by a user
NEEDS_TENSORFLOW = {"init", "names", "calibrate", "doctor", "suite", "run", "checkpoint",
                    "repro"}   # repro: the scripts it runs, in their environment


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"   # argparse wraps to the terminal: the same page everywhere
    from verify.__main__ import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions
                      if a.__class__.__name__ == "_SubParsersAction")
    helps = {action.dest: action.help for action in subparsers._choices_actions}
    names = ordered(subparsers.choices)
    rows = ["| command | needs TensorFlow | what it does |", "|---|---|---|"]
    rows += [f"| [`{name}`](#{name}) | {'yes' if name in NEEDS_TENSORFLOW else 'no'} | "
             f"{_cell(helps.get(name) or '')} |" for name in names]
    sections = ["\n".join(rows)]
    for name in names:
        command = subparsers.choices[name]
        if command.add_help:
            sections.append(f"## `{name}` {{#{name}}}\n\n" + _help(parser, [name]))
        else:   # `suite`: every argument is pytest's
            sections.append(f"## `{name}` {{#{name}}}\n\n`python -m verify suite [--cases PATH] "
                            f"[--report-dir DIR] [pytest options]`: the installed parity suite "
                            f"from the working directory; `python -m verify suite --help` "
                            f"prints pytest's help with the suite's options.")
    return markdown.replace(MARKER, "\n\n".join(sections))


def ordered(commands) -> list[str]:
    """The commands users run, in `ORDER`, then any new one the order does not know yet."""
    known = [name for name in ORDER if name in commands]
    return known + [name for name in commands if name not in ORDER and name not in INTERNAL]


def _cell(text: str) -> str:
    """Help text as one table cell: one line, brackets and bars taken literally."""
    return " ".join(text.split()).replace("[", "\\[").replace("|", "\\|")


def _help(parser, args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args([*args, "--help"])
    return "```text\n" + out.getvalue().rstrip() + "\n```"
