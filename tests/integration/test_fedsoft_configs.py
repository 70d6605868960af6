"""FedSoft's offline paper configs run end to end through the CLI (2 rounds, 1 local epoch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_lightning.cli import FederatedCLI

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "papers"


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


@pytest.mark.parametrize(("name", "metric"), [("fedsoft_synthetic", "src1_c1_loss"), ("fedsoft_digits", "src1_c1_acc")])
def test_config_runs_two_rounds(name, metric):
    cli = FederatedCLI(
        args=[
            "fit",
            "--config",
            str(CONFIGS / f"{name}.yaml"),
            "--trainer.max_epochs=2",
            "--trainer.local_epochs=1",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--data.init_args.batch_size=200",  # one local step per client: the wiring, not the learning, is under test
        ]
    )
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.current_epoch == 2
    assert type(cli.trainer.algorithm).__name__ == "FedSoft"
    for key in (metric, "u_error", "personal_train_loss", "personal_heldout_loss"):
        assert f"round/{key}" in metrics, key
