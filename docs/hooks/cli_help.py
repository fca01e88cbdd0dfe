"""MkDocs hook: put every `python -m verify` command's `--help` into the command-line page, from
the parser itself, so the page never drifts from the code."""
from __future__ import annotations

import contextlib
import io
import os

MARKER = "<!-- cli-help -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    os.environ["COLUMNS"] = "100"   # argparse wraps to the terminal: the same page everywhere
    from verify.__main__ import build_parser

    parser = build_parser()
    sections = [_help(parser, [])]
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in commands.choices.items():
        if command.add_help:
            sections.append(f"## `{name}`\n\n" + _help(parser, [name]))
        else:   # `suite`: every argument is pytest's
            sections.append(f"## `{name}`\n\n`python -m verify suite [--cases PATH] "
                            f"[--report-dir DIR] [pytest options]`: the installed parity suite "
                            f"from the working directory; `python -m verify suite --help` "
                            f"prints pytest's help with the suite's options.")
    return markdown.replace(MARKER, "\n\n".join(sections))


def _help(parser, args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args([*args, "--help"])
    return "```text\n" + out.getvalue().rstrip() + "\n```"
