"""PNG plots of a study: one line per arm, the mean over seeds with a ±1 std band (needs matplotlib).

The plotted metrics are the runs' own validation metrics (see :mod:`fl_lightning.study.report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import re

import numpy as np

from fl_lightning.study.metrics import TOTAL_UPLOAD, VIRTUAL_TIME, History, byte_unit, mean_curve

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROUND = "round"


@dataclass(frozen=True)
class PlotSpec:
    """One plot: ``y`` against ``x`` (a logged metric, or ``"round"``, counted from 1)."""

    name: str
    x: str
    y: str
    xlabel: str
    ylabel: str
    bytes_axis: bool = False


def plot_specs(metrics: Sequence[str]) -> list[PlotSpec]:
    """``<metric>_vs_round`` for every metric; the first (the monitored one) also against the bytes
    uploaded and the virtual time. File names replace characters other than letters, digits, ``.-_`` by ``_``.

    Example:
        >>> [plot.name for plot in plot_specs(["val/acc", "val/nll"])]
        ['val_acc_vs_round', 'val_acc_vs_upload', 'val_acc_vs_virtual_time', 'val_nll_vs_round']
    """
    plots = []
    for index, metric in enumerate(metrics):
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", metric)
        plots.append(PlotSpec(f"{stem}_vs_round", ROUND, metric, "round", metric))
        if index == 0:
            plots.append(PlotSpec(f"{stem}_vs_upload", TOTAL_UPLOAD, metric, "uploaded by all clients", metric, bytes_axis=True))
            plots.append(PlotSpec(f"{stem}_vs_virtual_time", VIRTUAL_TIME, metric, "virtual time", metric))
    return plots


def require_matplotlib() -> None:
    """Raises a :class:`ModuleNotFoundError` that says how to get matplotlib, or to turn plots off."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ModuleNotFoundError(
            "Study plots need matplotlib: `pip install 'fl-lightning[plots]'`, or set `plots: false` in the "
            "study file (or pass `--plots false`)."
        ) from error


def curve(history: History, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` over the rounds that logged both (``x="round"`` counts rounds from 1)."""
    rows = [row for row in history if y in row and (x == ROUND or x in row)]
    xs = [row["round"] + 1 if x == ROUND else row[x] for row in rows]
    return np.asarray(xs, dtype=float), np.asarray([row[y] for row in rows], dtype=float)


def draw(
    plot: PlotSpec, histories: Mapping[str, Sequence[History]], *, title: str = "", target: float | None = None
) -> Figure | None:
    """The figure of ``plot``, one line per arm (and a dashed ``target`` line); ``None`` if no run logged its x and y."""
    require_matplotlib()
    from matplotlib.figure import Figure

    curves = {arm: [c for h in runs if len((c := curve(h, plot.x, plot.y))[0])] for arm, runs in histories.items()}
    curves = {arm: c for arm, c in curves.items() if c}
    if not curves:
        return None
    scale, unit = 1.0, ""
    if plot.bytes_axis:
        scale, unit = byte_unit(max(float(x.max()) for runs in curves.values() for x, _ in runs))
    figure = Figure(figsize=(6.4, 4.2), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    for arm, runs in curves.items():
        x, mean, std = mean_curve(runs)
        x = x / scale
        (line,) = axes.plot(x, mean, label=f"{arm} (n={len(runs)})", marker="o" if len(x) <= 12 else None, markersize=3)
        if len(runs) > 1:
            axes.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xlabel(f"{plot.xlabel} ({unit})" if unit else plot.xlabel)
    axes.set_ylabel(plot.ylabel)
    axes.set_title(title or f"{plot.ylabel} vs {plot.xlabel}")
    axes.grid(True, alpha=0.3)
    axes.legend(title="mean ± 1 std over seeds", fontsize="small", title_fontsize="small")
    return figure


def write_plots(
    directory: Path,
    histories: Mapping[str, Sequence[History]],
    *,
    metrics: Sequence[str],
    study: str = "",
    target: float | None = None,
) -> dict[str, Path]:
    """Draws every plot of :func:`plot_specs` that has data into ``directory/<name>.png``; returns name -> path.

    ``target`` is drawn on the plots of the first metric (the monitored one).
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for plot in plot_specs(metrics):
        title = f"{study}: {plot.ylabel} vs {plot.xlabel}" if study else ""
        figure = draw(plot, histories, title=title, target=target if plot.y == metrics[0] else None)
        if figure is not None:
            path = directory / f"{plot.name}.png"
            figure.savefig(path)
            written[plot.name] = path
    return written
