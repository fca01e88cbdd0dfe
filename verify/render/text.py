"""Small text helpers shared by the renderers."""
from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """'1 pair', '3 pairs'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def clip(text, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell(text: str, limit: int) -> str:
    """`clip` for a markdown table cell: `|` escaped."""
    return clip(text, limit).replace("|", "\\|")

