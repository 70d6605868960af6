"""Partition summary: each client's label counts, printed and plotted (flwr-datasets' ``compute_counts`` and
``plot_label_distributions``).

From a config (the ``data:`` block of any ``fl-lightning fit`` config; a plain ``LightningDataModule`` is
federated with the config's ``trainer.num_clients`` and ``trainer.partitioner``, as ``fit`` does)::

    python -m fl_lightning.data.partition_summary --config configs/quickstart.yaml --plot labels.png

or from Python::

    from fl_lightning.data.partition_summary import label_counts, format_counts, plot_counts
    labels, counts = label_counts(datamodule)      # counts[c, j]: client c's samples of label labels[j]
    print(format_counts(labels, counts))
    plot_counts(labels, counts, "labels.png")      # needs matplotlib (the `plots` extra)

The counts are of the clients' training samples (the server's validation split and each client's held-out
samples excluded). A naturally partitioned dataset (``NaturalDataModule``) is read client by client; its
labels are class ids (one a sample) or multi-hot rows (FLAIR's, TFF Stack Overflow tags'), counted per label.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule

PlotKind = Literal["bar", "heatmap"]
SizeUnit = Literal["absolute", "percent"]


def label_counts(datamodule: Any, *, max_clients: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, counts)``: the labels, and ``counts[c, j]`` the number of client ``c``'s training samples
    of label ``labels[j]`` (flwr-datasets' ``compute_counts``, a client a row).

    Args:
        datamodule: A :class:`~fl_lightning.data.FederatedDataModule` (partitioned now if it was not yet)
            or :class:`~fl_lightning.data.NaturalDataModule`.
        max_clients: Count only the first clients (a natural dataset reads every client it counts).
    """
    from fl_lightning.data.datamodule import FederatedDataModule
    from fl_lightning.data.natural import NaturalDataModule

    num_clients = datamodule.num_clients if max_clients is None else min(max_clients, datamodule.num_clients)
    if isinstance(datamodule, FederatedDataModule):
        datamodule.setup("fit")
        if getattr(datamodule.train, "targets", None) is not None:
            rows = [datamodule.label_counts(cid) for cid in range(num_clients)]
        else:  # a user's dataset without `targets`: each sample's last element is its label
            rows = [_sample_counts(datamodule, cid) for cid in range(num_clients)]
    elif isinstance(datamodule, NaturalDataModule):
        rows = [_natural_counts(datamodule, cid) for cid in range(num_clients)]
    else:
        raise TypeError(
            f"label_counts needs a FederatedDataModule or a NaturalDataModule, got {type(datamodule).__name__}; "
            "federate it first (FederatedDataModule.from_datamodule)."
        )
    width = max((len(row) for row in rows), default=0)
    counts = np.zeros((num_clients, width), dtype=np.int64)
    for cid, row in enumerate(rows):
        counts[cid, : len(row)] = row
    return np.arange(width), counts


def _sample_counts(datamodule: Any, cid: int) -> np.ndarray:
    labels = [datamodule.train[int(i)][-1] for i in datamodule.client_indices(cid)]
    return _counts_of(torch.stack([torch.as_tensor(label) for label in labels]), datamodule)


def _natural_counts(datamodule: Any, cid: int) -> np.ndarray:
    from fl_lightning.data.client_reader import ClientSamples

    return _counts_of(ClientSamples(datamodule.train, cid).tensors[-1], datamodule)


def _counts_of(y: torch.Tensor, datamodule: Any) -> np.ndarray:
    """Per-label counts of one client's labels: class ids (``[n]`` integers) or multi-hot rows (``[n, labels]``)."""
    if y.dim() == 1 and not torch.is_floating_point(y):
        return np.bincount(y.numpy(), minlength=getattr(datamodule, "num_classes", 0) or 0)
    if y.dim() == 2:  # multi-hot rows: a sample counts once for each of its labels
        return (y.numpy() > 0).sum(axis=0).astype(np.int64)
    raise ValueError(
        f"{type(datamodule).__name__}'s labels are {tuple(y.shape)} {y.dtype} tensors (sequences?), not class ids or "
        "multi-hot rows: there are no per-client label counts to show."
    )


def format_counts(labels: Sequence[Any], counts: np.ndarray, *, client_ids: Sequence[str] | None = None) -> str:
    """The counts as a text table: a client a row (its id if given), a label a column, and the client's total."""
    names = [str(cid) for cid in range(len(counts))] if client_ids is None else [str(c) for c in client_ids]
    header = ["client", *[str(label) for label in labels], "total"]
    body = [[name, *[str(int(v)) for v in row], str(int(row.sum()))] for name, row in zip(names, counts, strict=True)]
    totals = ["all", *[str(int(v)) for v in counts.sum(axis=0)], str(int(counts.sum()))]
    table = [header, *body, totals]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
    return "\n".join([*lines[:-1], "-" * len(lines[0]), lines[-1]])


def plot_counts(
    labels: Sequence[Any],
    counts: np.ndarray,
    path: str | Path,
    *,
    kind: PlotKind = "bar",
    size_unit: SizeUnit = "absolute",
    title: str = "Per-client label distribution",
) -> Path:
    """Writes the label distribution as an image (the format from ``path``'s suffix) and returns ``path``.

    ``kind="bar"``: a stacked bar per client, a colour per label; ``"heatmap"``: clients by labels. With
    ``size_unit="percent"`` each client's counts are its percentages (flwr-datasets'
    ``plot_label_distributions`` options). Needs matplotlib: ``pip install 'fl-lightning[plots]'``.
    """
    if kind not in ("bar", "heatmap"):
        raise ValueError(f"kind must be 'bar' or 'heatmap', got {kind!r}.")
    if size_unit not in ("absolute", "percent"):
        raise ValueError(f"size_unit must be 'absolute' or 'percent', got {size_unit!r}.")
    try:  # imported here: only plots need it (the `plots` extra)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ModuleNotFoundError("Partition plots need matplotlib: pip install 'fl-lightning[plots]'.") from None
    values = counts.astype(np.float64)
    if size_unit == "percent":
        totals = values.sum(axis=1, keepdims=True)
        values = np.divide(values * 100, totals, out=np.zeros_like(values), where=totals > 0)
    clients = np.arange(len(values))
    figure = Figure(figsize=(max(6.0, 0.25 * len(clients) + 2), 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    unit = "%" if size_unit == "percent" else "samples"
    if kind == "bar":
        bottom = np.zeros(len(clients))
        for j, label in enumerate(labels):
            axes.bar(clients, values[:, j], bottom=bottom, label=str(label), width=0.9)
            bottom += values[:, j]
        axes.set_ylabel(unit)
        if len(labels) <= 30:
            axes.legend(title="label", fontsize="small", bbox_to_anchor=(1.01, 1), loc="upper left")
    else:
        image = axes.imshow(values.T, aspect="auto", interpolation="nearest", cmap="Greens", origin="lower")
        figure.colorbar(image, ax=axes, label=unit)
        axes.set_ylabel("label")
        if len(labels) <= 30:
            axes.set_yticks(range(len(labels)), [str(label) for label in labels])
    axes.set_xlabel("client")
    axes.set_title(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path)
    return path


def datamodule_from_config(path: str | Path) -> LightningDataModule:
    """The ``data:`` block of an ``fl-lightning fit`` config, built; a plain datamodule federated with the
    config's ``trainer.num_clients`` (default 10) and ``trainer.partitioner`` (default IID), as ``fit`` does."""
    import yaml
    from jsonargparse import ArgumentParser

    from fl_lightning.data.datamodule import FederatedDataModule
    from fl_lightning.data.natural import NaturalDataModule
    from fl_lightning.data.partitioners import Partitioner

    config = yaml.safe_load(Path(path).read_text())
    if not isinstance(config, dict) or "data" not in config:
        raise ValueError(f"{str(path)!r} has no `data:` block.")
    trainer = config.get("trainer") or {}
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    parser.add_subclass_arguments(Partitioner, "partitioner", required=False)
    parser.add_argument("--num_clients", type=int, default=10)
    values = {"data": config["data"], "num_clients": trainer.get("num_clients") or 10}
    if trainer.get("partitioner") is not None:
        values["partitioner"] = trainer["partitioner"]
    built = parser.instantiate(parser.parse_object(values))
    data = built.data
    if isinstance(data, (FederatedDataModule, NaturalDataModule)):
        return data
    return FederatedDataModule.from_datamodule(data, partitioner=built.get("partitioner"), num_clients=built.num_clients)


def main(args: Sequence[str] | None = None) -> None:
    """``python -m fl_lightning.data.partition_summary``: prints a config's per-client label counts, and plots them."""
    parser = argparse.ArgumentParser(prog="python -m fl_lightning.data.partition_summary", description=main.__doc__)
    parser.add_argument("--config", required=True, help="an fl-lightning fit config (its data: block is used)")
    parser.add_argument("--plot", help="write the label distribution to this image file (.png, .pdf, .svg)")
    parser.add_argument("--kind", choices=["bar", "heatmap"], default="bar")
    parser.add_argument("--percent", action="store_true", help="plot each client's label percentages")
    parser.add_argument("--max-clients", type=int, default=None, help="summarise only the first N clients")
    options = parser.parse_args(args)
    try:
        datamodule = datamodule_from_config(options.config)
        labels, counts = label_counts(datamodule, max_clients=options.max_clients)
    except (OSError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    ids = getattr(datamodule, "client_ids", None)
    print(format_counts(labels, counts, client_ids=None if ids is None else list(ids)[: len(counts)]))
    if options.plot:
        size_unit: SizeUnit = "percent" if options.percent else "absolute"
        print(f"wrote {plot_counts(labels, counts, options.plot, kind=options.kind, size_unit=size_unit)}")


if __name__ == "__main__":
    main()
