"""W&B run names from a config get the run's start time, once; a run with a fixed id keeps its name."""

from __future__ import annotations

from datetime import datetime

from jsonargparse import Namespace

from fl_lightning.utils.run_names import stamp_wandb_names, stamped

START = datetime(2026, 11, 26, 0, 45, 12)
WANDB = "lightning.pytorch.loggers.WandbLogger"


def logger(class_path: str, **init_args: object) -> Namespace:
    return Namespace(class_path=class_path, init_args=Namespace(**init_args))


def test_the_start_time_is_appended_once() -> None:
    assert stamped("quickstart", START) == "quickstart-20261126-004512"
    # A saved config run again: the old stamp is replaced, not stacked.
    assert stamped("quickstart-20261120-101010", START) == "quickstart-20261126-004512"


def test_only_wandb_loggers_with_a_name_and_no_id_are_stamped() -> None:
    loggers = [
        logger(WANDB, name="quickstart", id=None, version=None),
        logger(WANDB, name="fedavg-seed0", id="abc123", version=None),  # a study's run: resumed by id
        logger(WANDB, name=None, id=None, version=None),  # W&B picks a random name
        logger("lightning.pytorch.loggers.CSVLogger", name="quickstart", version=None),  # version_<n> folders
    ]
    stamp_wandb_names(loggers, START)
    assert [entry.init_args.name for entry in loggers] == ["quickstart-20261126-004512", "fedavg-seed0", None, "quickstart"]
    single = logger("lightning.pytorch.loggers.wandb.WandbLogger", name="run", id=None, version=None)
    stamp_wandb_names(single, START)
    assert single.init_args.name == "run-20261126-004512"
    stamp_wandb_names(False, START)  # logger: false
