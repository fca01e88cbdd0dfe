"""Small text helpers shared by the renderers: plain text, and text made safe for markdown."""
from __future__ import annotations

import re

# What GitHub-flavoured markdown reads as markup anywhere in a line: escapes, code, emphasis,
# links and images, raw HTML and entities, table cells, math and strikethrough.
MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]<>|&$~]")


def plural(count: int, noun: str) -> str:
    """'1 pair', '3 pairs'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def clip(text, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def markdown(text, limit: int) -> str:
    """`clip`, then escaped so that markdown shows it as written, in a table cell or in running
    text: every markup character gets a backslash, `_` too unless it sits inside a word (where
    it cannot start emphasis, and `tpu_embedding` stays readable).

    >>> print(markdown("a|b*<script>$x$ _u_ tpu_embedding", 80))
    a\\|b\\*\\<script\\>\\$x\\$ \\_u\\_ tpu_embedding
    """
    text = MARKDOWN_SPECIAL.sub(lambda m: "\\" + m.group(), clip(text, limit))
    return re.sub(r"(?<![^\W_])_|_(?![^\W_])", r"\\_", text)


def code(text, limit: int) -> str:
    """`clip`, as a markdown code span whatever backticks it holds.

    >>> print(code("a`b", 80))
    `` a`b ``
    """
    text = clip(text, limit)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if fence != "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"
