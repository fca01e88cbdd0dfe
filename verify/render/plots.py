"""The plots of report.html: per pair, the loss curves of both sides and the drift per step on
a log scale per quantity, drawn on one reused Agg canvas and encoded as small palette PNGs.

Every figure has the same pixel size (FIGURE_INCHES at FIGURE_DPI). Implementation and tensor
names are drawn as written, never as mathtext. Nothing here imports TensorFlow; matplotlib and
Pillow are imported when a page is drawn.

>>> int(FIGURE_INCHES[0] * FIGURE_DPI), int(FIGURE_INCHES[1] * FIGURE_DPI)
(960, 256)
"""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

from verify.core.quantities import NUMERIC as NUMERIC_QUANTITIES
from verify.core.quantities import QUANTITIES
from verify.store.results import numeric_rows

FIGURE_INCHES = (12.0, 3.2)
FIGURE_DPI = 80
QUANTITY_COLORS = {q.name: q.colour for q in QUANTITIES if q.numeric}
FAILURE_COLOR = "#d62728"
LOSS_TITLE = "loss per step"
DRIFT_TITLE = "drift: max |candidate - reference| over tensors"


class PairPlotter:
    """Draws every pair's figure on one reused Agg canvas (no pyplot, no global backend)."""

    def __enter__(self) -> "PairPlotter":
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
        FigureCanvasAgg(self.figure)
        # Fixed axes (no tight_layout: it draws every figure twice); legends go right of each.
        # A pair with data removes only what the pair before drew (`_reset`), so the axes keep
        # their tick objects, which clearing them would rebuild on every draw (about a third
        # of a figure's drawing time, measured); a pair without data gets them cleared.
        self.loss_ax = self.figure.add_axes((0.05, 0.15, 0.31, 0.75))
        self.drift_ax = self.figure.add_axes((0.52, 0.15, 0.31, 0.75))
        _reset(self.loss_ax, LOSS_TITLE, keep=False)
        _reset(self.drift_ax, DRIFT_TITLE, keep=False)
        self.width = int(FIGURE_INCHES[0] * FIGURE_DPI)
        self.height = int(FIGURE_INCHES[1] * FIGURE_DPI)
        return self

    def __exit__(self, *exc) -> None:
        self.figure.clear()
        if getattr(self, "layer_figure", None) is not None:
            self.layer_figure.clear()

    def layers_png(self, layers: pd.DataFrame) -> bytes:
        """A replayed step's drift per layer (`verify.judge.layers`), in forward order: how
        many times its tolerance each value and each gradient is from agreement (log scale;
        above 1 fails)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        if getattr(self, "layer_figure", None) is None:
            self.layer_figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI)
            FigureCanvasAgg(self.layer_figure)
            self.layer_ax = self.layer_figure.add_axes((0.05, 0.32, 0.78, 0.58))
        ax = self.layer_ax
        ax.clear()
        step = int(layers["step"].iloc[0]) if len(layers) else 0
        ax.set_title(f"replayed step {step}: drift per layer, in times its tolerance",
                     fontsize=10)
        forward = layers[layers["direction"] == "forward"].sort_values("order")
        keys = list(zip(forward["layer"], forward["kind"], forward["part"].fillna("")))
        labels = [f"{layer} {kind}" + (f" [{part}]" if part else "") for layer, kind, part in keys]
        floor = 1e-3
        for direction, marker, colour in (("forward", "o", "#1f77b4"),
                                          ("backward", "s", "#ff7f0e")):
            chosen = layers[layers["direction"] == direction].assign(
                part=lambda frame: frame["part"].fillna("")).set_index(["layer", "kind", "part"])
            x, y, bad = [], [], []
            for n, key in enumerate(keys):
                if key in chosen.index:
                    ratio = float(chosen.loc[key, "times_tolerance"])
                    if not np.isnan(ratio):
                        x.append(n)
                        y.append(max(ratio, floor))
                        bad.append(chosen.loc[key, "status"] == "failed")
            ax.plot(x, y, marker, color=colour, markersize=6, linestyle="-", linewidth=1,
                    label="value" if direction == "forward" else "gradient")
            failed = [(a, b) for a, b, f in zip(x, y, bad) if f]
            if failed:
                ax.plot(*zip(*failed), "x", color=FAILURE_COLOR, markersize=9,
                        markeredgewidth=2)
        ax.set_yscale("log")
        ax.axhline(1.0, color=FAILURE_COLOR, linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
        for text in ax.get_xticklabels():
            text.set_parse_math(False)
        _legend(ax)
        ax.tick_params(axis="y", labelsize=8)
        self.layer_figure.canvas.draw()
        return _palette_png(self.layer_figure.canvas.buffer_rgba())

    def pair_png(self, rows: pd.DataFrame, losses: pd.DataFrame, reference: str,
                 candidate: str, first_step: int | None) -> bytes:
        self._losses(losses, reference, candidate, first_step)
        self._drift(rows, first_step)
        self.figure.canvas.draw()
        return _palette_png(self.figure.canvas.buffer_rgba())

    def _losses(self, losses: pd.DataFrame, reference: str, candidate: str,
                first_step: int | None) -> None:
        drawn = bool(losses[["reference_loss", "candidate_loss"]].notna().to_numpy().any())
        ax = _reset(self.loss_ax, LOSS_TITLE, keep=drawn)
        for tensor, curve in losses.groupby("tensor", sort=True):
            curve = curve.sort_values("step")
            suffix = "" if tensor == "loss" else f" {tensor}"
            for column, name, style in (("reference_loss", reference, "-"),
                                        ("candidate_loss", candidate, "--")):
                values = curve[column].astype(float)
                if values.notna().any():
                    ax.plot(curve["step"], values, style, marker="." if style == "-" else "x",
                            markersize=4, linewidth=1.2, label=f"{name}{suffix}")
        if not drawn:
            ax.text(0.5, 0.5, "no per-step loss captured", ha="center", va="center",
                    transform=ax.transAxes, color="#666")
        self._mark(ax, first_step)
        if drawn:
            _legend(ax)

    def _drift(self, rows: pd.DataFrame, first_step: int | None) -> None:
        from matplotlib.ticker import FuncFormatter, NullLocator

        numeric = numeric_rows(rows)
        ax = _reset(self.drift_ax, DRIFT_TITLE, keep=not numeric.empty)
        if numeric.empty:
            ax.text(0.5, 0.5, "no drift measured", ha="center", va="center",
                    transform=ax.transAxes, color="#666")
            self._mark(ax, first_step)
            return
        per_step = numeric.groupby(["quantity", "step"], sort=True)["max_abs"].max()
        failing = numeric.loc[~numeric["passed"].astype(bool), ["quantity", "step"]] \
            .drop_duplicates()
        positive = per_step[per_step > 0]
        floor = 10.0 ** (np.floor(np.log10(positive.min())) - 1) if len(positive) else 1e-12
        for quantity in [q for q in NUMERIC_QUANTITIES if q in per_step.index.get_level_values(0)]:
            series = per_step.loc[quantity].clip(lower=floor)
            ax.plot(series.index, series.to_numpy(), marker=".", markersize=4, linewidth=1.2,
                    color=QUANTITY_COLORS[quantity], label=quantity)
        if not failing.empty:
            points = per_step.loc[list(map(tuple, failing.to_numpy()))].clip(lower=floor)
            ax.plot(points.index.get_level_values(1), points.to_numpy(), "x",
                    color=FAILURE_COLOR, markersize=7, markeredgewidth=2, label="failing")
        if ax.get_yscale() != "log":   # after plotting: empty axes have no valid log limits
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        ax.axhline(floor, color="#999", linewidth=0.8, linestyle=":")
        ax.annotate("0 (identical)", (0.01, floor), xycoords=("axes fraction", "data"),
                    fontsize=7, color="#666", va="bottom")
        self._mark(ax, first_step)
        _legend(ax)

    @staticmethod
    def _mark(ax, first_step: int | None) -> None:
        if first_step is not None:
            ax.axvline(first_step, color=FAILURE_COLOR, linewidth=1.2, linestyle="--",
                       label=f"first divergence (step {first_step})")


def _reset(ax, title: str, keep: bool):
    """`ax` ready for the next pair. `keep` (the pair has data to plot): without the lines
    and texts the pair before drew, its limits to be found again from the data, its
    title, labels, tick objects and scale kept; otherwise cleared as new."""
    if not keep:
        ax.clear()
        # y given: the title is not moved above tick labels (there are none on top), which
        # would measure every tick label on every draw
        ax.set_title(title, fontsize=10, y=1.0)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        return ax
    for artist in [*ax.lines, *ax.texts, *ax.collections]:
        artist.remove()   # the legend is replaced by the pair's own (`_legend`)
    ax.set_prop_cycle(None)   # the pair's lines take the colours new axes give
    ax.relim()
    ax.autoscale()
    return ax


def _legend(ax) -> None:
    """The axes' legend, right of it. Labels hold implementation and tensor names: they are
    drawn as written, never as mathtext (`$...$` would be parsed, mangled, or raise)."""
    legend = ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    for text in legend.get_texts():
        text.set_parse_math(False)


def _palette_png(rgba) -> bytes:
    """Encode a drawn canvas as a 64-colour palette PNG: about a third of the bytes of RGBA."""
    from PIL import Image

    image = Image.fromarray(np.asarray(rgba)).convert("RGB").quantize(colors=64)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()
