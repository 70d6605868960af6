"""The papers' real-data configs, run for a few rounds on their datasets, against what the papers state (issue 27).

For each selected config of :data:`benchmarks.real_data_numbers.CONFIGS` (all by default) this runs
``fl-lightning fit`` in-process on a copy of ``configs/papers/<name>.yaml`` that changes only the run's length
(``--rounds``, else the config's short default; ``--full``: the config's own, the paper's, round count), where
its data lives (``--data-dir``, downloaded first with ``--download``), the accelerator, and what it logs (a
CSV per run under ``--out-dir``, with the per-round test curve, ``TestCurve``, where the accuracy is
``test_acc``). It then reads our accuracy at the last round and prints a Markdown table: config, rounds run,
our accuracy, the paper's number and the round it is reported at, where the paper states it, the tolerance and
the verdict.

Verdicts: ``within`` / ``below`` / ``above`` the paper's number ± tolerance, compared only when our run
stopped at the paper's round; ``no paper number`` otherwise (the papers state final accuracies only, so a
short run is never compared: it shows that the config runs on its real data and what it reaches; the row
names the paper's number and its round). A config whose dataset is absent gets one line saying which dataset
and how to get it; a run that fails gets its error. Exit status: 1 if any comparison is ``below`` or
``above`` or any run failed, else 2 if any config was skipped for missing data, else 0.

Needs a GPU for anything but the smallest configs (``--accelerator gpu``) and internet once for
``--download`` (MNIST 12 MB, Fashion-MNIST 30 MB, EMNIST 540 MB, CIFAR-10/100 170 MB each, SVHN 180 MB).
From the repository root::

    python benchmarks/real_data.py --accelerator gpu --download --out real_data.md            # every config, short
    python benchmarks/real_data.py --configs fedmrn_fmnist fedmrn_svhn --accelerator gpu --full   # Table 1 check
    python benchmarks/real_data.py --configs flexible_mnist --rounds 20 --data-dir /datasets
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.real_data_numbers import CONFIGS, REAL_DATASETS, PaperNumber, RealDataConfig
from benchmarks.reporting import emit, header, load

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "papers"
#: Verdicts that fail the run; ``no paper number`` and ``within`` do not.
FAILED = ("below", "above", "run failed")
MISSING = "missing data"
COLUMNS = ("config", "rounds run", "ours (%)", "paper (%)", "paper's round", "where", "tolerance", "verdict")


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    config: str
    rounds: int | None
    ours: float | None
    paper: PaperNumber | None
    where: str
    verdict: str

    def cells(self) -> list[str]:
        number = self.paper
        return [
            self.config,
            "–" if self.rounds is None else str(self.rounds),
            "–" if self.ours is None else f"{self.ours:.1f}",
            "–" if number is None else f"{number.value:.1f}",
            "–" if number is None else str(number.round),
            self.where,
            "–" if number is None else f"± {number.tolerance:.1f}",
            self.verdict,
        ]


def verdict(ours: float | None, number: PaperNumber, rounds: int) -> str:
    """``within``, ``below`` or ``above`` ``number`` ± its tolerance (our accuracy in %); ``no paper number``
    when our run did not stop at the paper's round or logged no accuracy.

    Example:
        >>> n = PaperNumber("test_acc", 90.2, 100, "Table 1", std=0.1)
        >>> verdict(89.5, n, 100), verdict(88.9, n, 100), verdict(91.3, n, 100), verdict(60.0, n, 5)
        ('within', 'below', 'above', 'no paper number')
    """
    if ours is None or rounds != number.round:
        return "no paper number"
    if ours < number.value - number.tolerance:
        return "below"
    return "above" if ours > number.value + number.tolerance else "within"


def accuracy(history: Sequence[Mapping[str, float]], metric: str) -> tuple[float | None, int | None]:
    """Our last logged accuracy of ``metric`` (a key, or a ``*`` pattern whose matches' maximum is taken) in %,
    and the number of rounds run (``None`` for both when nothing was logged)."""
    rounds = int(history[-1]["round"]) + 1 if history else None
    for row in reversed(history):
        values = [value for key, value in row.items() if fnmatch.fnmatchcase(key, metric) and math.isfinite(value)]
        if values:
            return 100 * max(values), rounds
    return None, rounds


def rows_for(spec: RealDataConfig, history: Sequence[Mapping[str, float]]) -> list[Row]:
    """The table's rows for one finished run: one per paper number, or one saying why there is none."""
    if not spec.numbers:
        ours, rounds = accuracy(history, spec.metric)
        return [Row(spec.name, rounds, ours, None, spec.no_number, "no paper number")]
    rows = []
    for number in spec.numbers:
        ours, rounds = accuracy(history, number.metric)
        rows.append(Row(spec.name, rounds, ours, number, number.where, verdict(ours, number, rounds or 0)))
    return rows


def run_config(spec: RealDataConfig, rounds: int, args: argparse.Namespace) -> list[dict[str, float]]:
    """Runs ``spec``'s config for ``rounds`` rounds in this process; returns its per-round history.

    Raises:
        FileNotFoundError: its dataset is not under ``--data-dir`` (and ``--download`` is off or failed).
    """
    from fl_lightning.cli import FederatedCLI
    from fl_lightning.study.metrics import read_history

    config = short_run(yaml.safe_load((CONFIG_DIR / f"{spec.name}.yaml").read_text()), spec, rounds, args)
    path = Path(args.out_dir) / f"{spec.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    # LightningCLI parses sys.argv as well as ``args``: this script's own options are not the config's.
    argv, sys.argv = sys.argv, ["fl-lightning"]
    try:
        cli = FederatedCLI(args=["fit", "--config", str(path)])
    except Exception as error:  # jsonargparse wraps the dataset's own error
        raise _missing_data(error) or error
    finally:
        sys.argv = argv
    metrics = Path(cli.trainer.logger.log_dir) / "metrics.csv"
    del cli
    _free_memory()
    return read_history([metrics])


def short_run(config: dict[str, Any], spec: RealDataConfig, rounds: int, args: argparse.Namespace) -> dict[str, Any]:
    """``config`` with ``rounds`` rounds on ``--accelerator``, the datasets under ``--data-dir``, a CSV log under
    ``--out-dir`` and no checkpoints, and, where our accuracy is the module's ``test_acc``, the per-round test
    curve; the federation, model and algorithm stay the config's."""
    trainer = config["trainer"]
    trainer["max_epochs"] = rounds
    trainer["accelerator"] = args.accelerator
    trainer["enable_checkpointing"] = False
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(Path(args.out_dir) / "logs"), "name": spec.name},
    }
    if any(number.metric == "test_acc" for number in spec.numbers) or spec.metric == "test_acc":
        curve = {"class_path": "fl_lightning.callbacks.TestCurve", "init_args": {"every_n_rounds": max(1, rounds // 10)}}
        trainer["callbacks"] = [*trainer.get("callbacks", []), curve]
    for dataset in _real_datasets(config):
        dataset.setdefault("init_args", {}).update(root=str(args.data_dir), download=args.download)
    return config


def _real_datasets(node: Any) -> list[dict[str, Any]]:
    """Every ``{class_path: fl_lightning.data.<torchvision dataset>, ...}`` in a parsed config, nested ones included."""
    if isinstance(node, list):
        return [found for item in node for found in _real_datasets(item)]
    if not isinstance(node, dict):
        return []
    own = [node] if node.get("class_path") in REAL_DATASETS else []
    return own + [found for value in node.values() for found in _real_datasets(value)]


def _missing_data(error: BaseException) -> FileNotFoundError | None:
    """The missing-dataset error inside ``error``'s chain of causes, if there is one."""
    while error is not None and not isinstance(error, FileNotFoundError):
        error = error.__cause__
    return error


def _free_memory() -> None:
    """Returns the finished run's GPU memory before the next config starts."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare(specs: Sequence[RealDataConfig], args: argparse.Namespace) -> list[Row]:
    """Runs every config of ``specs`` and returns the table's rows."""
    rows: list[Row] = []
    for spec in specs:
        rounds = args.rounds or (_paper_rounds(spec) if args.full else spec.early_rounds)
        print(f"== {spec.name}: {rounds} rounds", file=sys.stderr, flush=True)
        try:
            history = run_config(spec, rounds, args)
        except FileNotFoundError as error:
            hint = (
                "copy its files under --data-dir and rerun without --download"
                if args.download
                else "rerun with --download, or point --data-dir at the folder that holds it"
            )
            rows.append(Row(spec.name, None, None, None, f"{error} ({hint})", MISSING))
            continue
        except Exception as error:  # one config's failure must not hide the others' results
            rows.append(Row(spec.name, None, None, None, f"{type(error).__name__}: {error}", "run failed"))
            continue
        rows.extend(rows_for(spec, history))
    return rows


def _paper_rounds(spec: RealDataConfig) -> int:
    """The round count of the paper's numbers, else the config's own (the paper's setting)."""
    if spec.numbers:
        return spec.numbers[0].round
    return int(yaml.safe_load((CONFIG_DIR / f"{spec.name}.yaml").read_text())["trainer"]["max_epochs"])


def table(rows: Sequence[Row]) -> list[str]:
    """The Markdown table of ``rows``."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    # A cell's own "|" (|T|) or line break (an error message) would end the cell or the row.
    return lines + ["| " + " | ".join(" ".join(cell.replace("|", "\\|").split()) for cell in row.cells()) + " |" for row in rows]


def exit_status(rows: Sequence[Row]) -> int:
    """1 if a comparison or a run failed, else 2 if a dataset was missing, else 0."""
    verdicts = {row.verdict for row in rows}
    if verdicts & set(FAILED):
        return 1
    return 2 if MISSING in verdicts else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = [spec.name for spec in CONFIGS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", choices=names, default=names, metavar="NAME", help=f"of: {', '.join(names)}")
    parser.add_argument("--rounds", type=_positive, help="rounds (aggregations) per config; default: each config's short run")
    parser.add_argument("--full", action="store_true", help="the paper's round count, so its numbers are compared")
    parser.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, gpu, cpu (default auto)")
    parser.add_argument("--data-dir", default="data", help="where the datasets are (or are downloaded to)")
    parser.add_argument("--download", action="store_true", help="download a missing dataset (torchvision)")
    parser.add_argument("--out-dir", default="real_data_runs", help="the runs' configs and CSV logs")
    parser.add_argument("--out", help="also write the report to this Markdown file")
    args = parser.parse_args(argv)
    if args.full and args.rounds:
        parser.error("--full runs the paper's round count; it cannot be combined with --rounds")
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the selected configs, prints (and with ``--out`` writes) the report; returns the exit status."""
    args = parse_args(argv)
    started, load_before = time.perf_counter(), load()
    rows = compare([spec for spec in CONFIGS if spec.name in args.configs], args)
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    report = ["# Real-data paper configs against the papers' numbers", "", *header(started, load_before, cuda=cuda), ""]
    emit("\n".join([*report, *table(rows)]), args.out)
    return exit_status(rows)


if __name__ == "__main__":
    raise SystemExit(main())
