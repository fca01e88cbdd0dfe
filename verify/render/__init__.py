"""Rendering a run's results into the files people read: summary.md (`markdown`),
report.html (`html`), the closing terminal lines (`terminal`), and the CSV tables behind them.
Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verify.core.files import json_default, write_atomic
from verify.render.html import render_html
from verify.render.markdown import summary_markdown
from verify.store.results import (DRIFT_FILE, RunResults, sort_layers, sort_losses, sort_pairs,
                            sort_preflight, sort_rows)

if TYPE_CHECKING:
    from verify.store.history import RunComparison


def write_report(report_dir: Path, results: RunResults, record: dict[str, Any] | None = None,
                 comparison: "RunComparison | None" = None) -> list[Path]:
    """Write drift.csv.gz, summary.csv, losses.csv, preflight.csv, layers.csv, summary.md,
    report.html and run.json.

    Each file is replaced atomically; `record` (see `verify.store.history.run_record`) becomes
    run.json when given. drift.csv.gz is gzip with no timestamp (identical rows, identical
    bytes); pandas reads it as it is (`pd.read_csv("drift.csv.gz")`).
    """
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ordered = dataclasses.replace(results, rows=sort_rows(results.rows),
                                  pairs=sort_pairs(results.pairs),
                                  losses=sort_losses(results.losses),
                                  layers=sort_layers(results.layers))
    files = {DRIFT_FILE: gzip.compress(ordered.rows.to_csv(index=False).encode(), compresslevel=6,
                                       mtime=0),
             "summary.csv": ordered.pairs.to_csv(index=False),
             "losses.csv": ordered.losses.to_csv(index=False),
             "preflight.csv": sort_preflight(ordered.preflight).to_csv(index=False),
             "layers.csv": ordered.layers.to_csv(index=False),
             "summary.md": summary_markdown(ordered, record, comparison),
             "report.html": render_html(ordered, record, comparison)}
    if record is not None:
        files["run.json"] = json.dumps(record, indent=1, default=json_default)
    written = []
    for name, text in files.items():
        write_atomic(report_dir / name, text)
        written.append(report_dir / name)
    return written
