"""The lines a session or the CLI prints at the end."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from verify.render.text import clip
from verify.store.results import RunResults, divergence_text, layer_text, pair_of_test, sort_pairs

if TYPE_CHECKING:
    from verify.store.history import RunComparison

MAX_LISTED = 15


def terminal_lines(results: RunResults, written: Iterable[Path],
                   comparison: "RunComparison | None" = None) -> list[str]:
    """The session's closing lines: verdict, one line per pair, regressions, files."""
    lines = [f"parity: {results.verdict}" + (f" ({results.stopped})" if results.stopped else "")]
    if results.nothing_selected:
        lines.append(f"  {results.nothing_selected}")
    for p in sort_pairs(results.pairs).itertuples(index=False):
        where = divergence_text(p)
        layer = layer_text(p)
        lines.append(f"  {p.verdict:<6} {p.case}: {p.reference} -> {p.candidate} "
                     f"(x{p.replicas}) " + (f"first divergence {where}" if where else "")
                     + (f"; layer: {clip(layer, 160)}" if layer else ""))
    for test_id, why in results.lost.items():
        lines.append(f"  LOST   {test_id}: {clip(why, 200)}")
    for test_id, why in list(results.not_run.items())[:MAX_LISTED]:
        lines.append(f"  NOTRUN {pair_of_test(test_id)}: {clip(why, 200)}")
    if len(results.not_run) > MAX_LISTED:
        lines.append(f"  … {len(results.not_run) - MAX_LISTED} more not run (run.json)")
    if comparison is not None:
        lines += comparison_terminal_lines(comparison)
    folders: dict[Path, list[str]] = {}
    for path in written:
        folders.setdefault(path.parent, []).append(path.name)
    for n, (folder, names) in enumerate(folders.items()):
        lines.append(f"{'report' if n == 0 else 'also'}: {folder}/ ({', '.join(names)})")
    return lines


def comparison_terminal_lines(comparison: "RunComparison") -> list[str]:
    """Regressions and changes since the compared run, one per line."""
    lines = [f"since {comparison.since()}: {comparison.headline()}"]
    lines += [f"  REGRESSION {text}" for text in comparison.regressions[:MAX_LISTED]]
    lines += [f"  changed    {text}" for text in comparison.changes[:MAX_LISTED]]
    return lines
