"""``fl-lightning`` reports bad configurations as one ``error:`` line (exit status 2), keeps tracebacks
for errors of a running model and under ``FL_LIGHTNING_DEBUG=1``, and fails an offline download cleanly."""

from __future__ import annotations

from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision.datasets.mnist

from fl_lightning.cli import main
from fl_lightning.cli.errors import DEBUG_ENV, EXIT_STATUS
from fl_lightning.models import MLP

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
FAST = ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the CLI, which must exit with status 2 after printing one ``error:`` line (its text)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == EXIT_STATUS
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # Refused by a constructor while LightningCLI instantiates the classes...
        (["--trainer.clients_per_round", "-1"], "error: FederatedTrainer: `clients_per_round` must be a positive count"),
        (["--data.init_args.partitioner.init_args.alpha", "-1"], "error: Dirichlet: `alpha` must be a finite number > 0, got -1.0."),
        (["--model.init_args.lr", "0"], "error: MLP: `lr` must be a finite number > 0, got 0.0."),
        (["--data.init_args.num_clients", "5000"], "error: FederatedDataModule: num_clients=5000 exceeds the 1293"),
        # ...or by fit before the first client trains (after Lightning's sanity check).
        (["--trainer.clients_per_round", "50"], "error: `clients_per_round=50` is not allowed with num_clients=20"),
        (["--ckpt_path", "missing.ckpt"], "error: Checkpoint file not found: missing.ckpt"),
        (
            ["--trainer.client_executor", "batched", "--trainer.gradient_clip_val", "1.0"],
            "error: client_executor='batched' does not support gradient_clip_val (got 1.0)",
        ),
    ],
    ids=["trainer", "nested-partitioner", "model", "data", "fit-start", "missing-checkpoint", "first-round"],
)
def test_a_bad_value_is_one_error_line(override: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(["fit", "--config", QUICKSTART, *FAST, "--trainer.logger", "false", *override], capsys)
    assert line.startswith(expected), line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            ["--data.init_args.partitioner", "fl_lightning.data.Dirichlett"],
            "error: data.partitioner: fl_lightning.data.Dirichlett: module 'fl_lightning.data' has no attribute 'Dirichlett' "
            "(did you mean fl_lightning.data.Dirichlet?)",
        ),
        (["--trainer.max_epochs", "x"], "error: trainer.max_epochs: Expected a <class 'int'>, got x"),
        (["--bogus", "1"], "error: unrecognized arguments: --bogus 1"),
    ],
    ids=["class-path-typo", "wrong-type", "unknown-option"],
)
def test_a_config_that_does_not_parse_is_one_error_line_and_a_tip(
    override: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, *override])
    assert exit_info.value.code == EXIT_STATUS
    assert capsys.readouterr().err.splitlines() == [expected, "tip: the accepted options: fl-lightning fit --help"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("local_epochs: 2", "local_epoch: 2"),
            "error: Subcommand 'fit' does not accept option 'trainer.local_epoch' (did you mean trainer.local_epochs?)",
        ),
        (
            ("fl_lightning.FedAvg", "fl_lightning.FedAVG"),
            "error: trainer.algorithm: fl_lightning.FedAVG: module 'fl_lightning' has no attribute 'FedAVG' "
            "(did you mean fl_lightning.FedAvg?)",
        ),
        (
            ("{alpha: 0.5}", "{alpah: 0.5}"),
            "error: data.partitioner: fl_lightning.data.Dirichlet: Option 'alpah' is not accepted (did you mean alpha?)",
        ),
        (
            ("batch_size: 10", "batch_sise: 10"),
            "error: data: fl_lightning.data.FederatedDataModule: Option 'batch_sise' is not accepted (did you mean batch_size?)",
        ),
        (
            ("class_path: fl_lightning.FedAvg", "class_path: fedavg"),
            "error: trainer.algorithm: Expected a dot import path string: fedavg, got {'class_path': 'fedavg'} "
            "(did you mean fl_lightning.FedAvg?)",
        ),
        (
            ("class_path: fl_lightning.FedAvg", "class_path: FedAvgM"),
            "error: trainer.algorithm: Expected a dot import path string: FedAvgM, got {'class_path': 'FedAvgM'} "
            "(FedAvgM is fl_lightning.FedAvg with server_optimizer: fl_lightning.ServerSGD (momentum > 0))",
        ),
    ],
    ids=["trainer-key", "class-case", "argument", "datamodule-argument", "bare-lowercase", "paper-method-name"],
)
def test_a_misspelt_yaml_key_or_name_gets_the_closest_spelling_and_the_subcommands_help(
    edit: tuple[str, str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "typo.yaml"
    text = Path(QUICKSTART).read_text()
    assert edit[0] in text
    config.write_text(text.replace(edit[0], edit[1], 1))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == EXIT_STATUS
    assert capsys.readouterr().err.splitlines() == [expected, "tip: the accepted options: fl-lightning fit --help"]


def test_the_debug_variable_keeps_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(ValueError, match=r"`alpha` must be a finite number > 0, got -1.0"):
        main(["fit", "--config", QUICKSTART, *FAST, "--data.init_args.partitioner.init_args.alpha", "-1"])


class FailingMLP(MLP):
    """Raises in its first training step: a bug in a running model, not a configuration error."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        raise ValueError("a bug in training_step")


def test_an_error_of_a_running_model_keeps_its_traceback() -> None:
    with pytest.raises(ValueError, match="a bug in training_step"):
        main(["fit", "--config", QUICKSTART, *FAST, "--trainer.logger", "false", "--model.class_path", f"{__name__}.FailingMLP"])


def test_an_offline_download_is_one_line_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # torchvision's own MNIST (it creates data/MNIST/raw, then downloads into it), with no network.
    def offline(url: str, *args: object, **kwargs: object) -> None:
        raise URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", offline)
    data = (
        "--data.init_args.train=fl_lightning.data.MNIST",
        "--data.init_args.train.init_args.download=true",
        "--data.init_args.train.init_args.root=data",
        "--data.init_args.test=null",
    )
    line = one_line_error(["fit", "--config", QUICKSTART, *FAST, *data], capsys)
    assert line.startswith("error: MNIST could not be downloaded to root='data' (<urlopen error [Errno -2] Name or service")
    assert "copy its files to data/MNIST/raw/" in line and "set download=False" in line
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "logs").exists()  # it failed while building the data, before any logger wrote


@pytest.mark.parametrize(("hidden", "shown"), [("[0]", "[0]"), ("[64, -1]", "[64, -1]")])
def test_a_zero_or_negative_hidden_width_is_one_error_line(hidden: str, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "--config", QUICKSTART, *FAST, "--trainer.logger", "false", "--model.init_args.hidden", hidden]
    line = one_line_error(args, capsys)
    assert line == f"error: MLP: `hidden` must be layer widths >= 1 (empty for no hidden layer), got {shown}."


def test_a_failed_start_leaves_no_run_folder_and_keeps_earlier_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    earlier = tmp_path / "logs" / "quickstart" / "version_0"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.ckpt").write_bytes(b"")
    line = one_line_error(["fit", "--config", QUICKSTART, *FAST, "--trainer.clients_per_round", "50"], capsys)
    assert line.startswith("error: `clients_per_round=50` is not allowed")
    assert sorted(p.name for p in (tmp_path / "logs" / "quickstart").iterdir()) == ["version_0"]  # version_1 is gone
    assert (earlier / "checkpoints" / "last.ckpt").exists()


def test_a_module_that_is_not_found_says_where_it_was_looked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(["fit", "--config", QUICKSTART, *FAST, "--model", "charlm.CharLM"], capsys)
    assert line == (
        f"error: model: charlm.CharLM: No module named 'charlm' (modules are imported from the working directory {tmp_path} "
        "and the installed packages)"
    )
