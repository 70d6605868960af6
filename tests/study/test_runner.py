"""What the runner gives each ``fl-lightning fit``: config layers, command, config check, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from fl_lightning.study.config_check import config_error
from fl_lightning.study.runner import RunState, command, error_message, plan, prepare
from fl_lightning.study.spec import study_from_dict

from .conftest import TINY

EARLY_STOPPING = {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": {"monitor": "val/nll"}}


def make_spec(tmp_path: Path, **fields):
    base = {**TINY, "trainer": {**TINY["trainer"], "callbacks": [EARLY_STOPPING]}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    data = {
        "name": "s",
        "base": "base.yaml",
        "seeds": [3],
        "arms": {"keep": {}, "replace": {"trainer.callbacks": []}},
        "directory": str(tmp_path / "study"),
        **fields,
    }
    return study_from_dict(data, root=tmp_path)


def layers(run) -> tuple[dict, dict]:
    return (
        yaml.safe_load((run.directory / "overrides.yaml").read_text()),
        yaml.safe_load((run.directory / "run.yaml").read_text()),
    )


def test_each_run_gets_its_seed_loggers_and_checkpoints_after_the_configs_callbacks(tmp_path):
    spec = make_spec(
        tmp_path, seed_keys=["seed_everything", "trainer.seed", "data.init_args.seed"], overrides={"trainer.max_epochs": 2}
    )
    keep, replace = plan(spec)
    state, args = prepare(spec, keep)
    overrides, run = layers(keep)
    assert overrides == {"trainer": {"max_epochs": 2}}
    assert run["seed_everything"] == run["trainer"]["seed"] == run["data"]["init_args"]["seed"] == 3
    assert run["trainer"]["default_root_dir"] == str(keep.directory)
    (csv_logger,) = run["trainer"]["logger"]
    assert csv_logger["init_args"]["save_dir"] == str(keep.directory) and csv_logger["init_args"]["name"] == "csv"
    callbacks = run["trainer"]["callbacks"]
    assert callbacks[0] == EARLY_STOPPING  # the base config's callbacks are kept
    checkpoint = callbacks[1]["init_args"]
    assert (checkpoint["dirpath"], checkpoint["save_last"], checkpoint["every_n_epochs"]) == (
        str(keep.last_checkpoint.parent),
        "link",
        1,
    )
    assert callbacks[2] == {"class_path": "fl_lightning.study.callback.CompletionMarker", "init_args": {"path": str(keep.marker)}}
    assert len(callbacks) == 3  # no W&B, no WandbRunSummary
    assert args[:4] == [sys.executable, "-m", "fl_lightning.cli", "fit"]
    assert args[4:] == [
        "--config",
        str(spec.base[0]),
        "--config",
        str(keep.directory / "overrides.yaml"),
        "--config",
        str(keep.directory / "run.yaml"),
    ]
    assert state.command.startswith("fl-lightning fit --config ")
    # An arm that sets its own callbacks replaces the base's, as a later --config would.
    prepare(spec, replace)
    assert [c["class_path"].rsplit(".", 1)[1] for c in layers(replace)[1]["trainer"]["callbacks"]] == [
        "ModelCheckpoint",
        "CompletionMarker",
    ]


def test_wandb_runs_share_the_study_group_with_the_arm_as_job_type(tmp_path):
    spec = make_spec(
        tmp_path,
        wandb={"project": "p", "entity": "team", "tags": ["t"]},
        monitor="val/acc",
        mode="max",
        target_accuracy=0.5,
        metrics=["round/x"],
    )
    keep = plan(spec)[0]
    state, _ = prepare(spec, keep)
    loggers = layers(keep)[1]["trainer"]["logger"]
    assert [logger["class_path"].rsplit(".", 1)[1] for logger in loggers] == ["CSVLogger", "WandbLogger"]
    wandb = loggers[1]["init_args"]
    assert {k: wandb[k] for k in ("project", "entity", "group", "job_type", "tags", "id", "name")} == {
        "project": "p",
        "entity": "team",
        "group": "s",
        "job_type": "keep",
        "tags": ["t", "keep"],
        "id": state.wandb_id,
        "name": "keep-seed3",
    }
    summary = layers(keep)[1]["trainer"]["callbacks"][-1]
    assert summary == {
        "class_path": "fl_lightning.study.callback.WandbRunSummary",
        "init_args": {"monitor": "val/acc", "mode": "max", "target_accuracy": 0.5, "metrics": {"round/x": "mean"}},
    }


def test_a_run_with_a_checkpoint_resumes_from_it_and_keeps_its_wandb_id(tmp_path):
    spec = make_spec(tmp_path)
    run = plan(spec)[0]
    state, args = prepare(spec, run)
    assert "--ckpt_path" not in args
    state.save(run)
    run.last_checkpoint.parent.mkdir(parents=True)
    torch.save({}, run.last_checkpoint)
    again, args = prepare(spec, run)
    assert args[-2:] == ["--ckpt_path", str(run.last_checkpoint)] and again.wandb_id == state.wandb_id
    assert command(spec, run, resume_from=None)[-1].endswith("run.yaml")


def test_a_run_whose_last_checkpoint_a_crash_left_dangling_resumes_from_its_newest_intact_round(tmp_path):
    spec = make_spec(tmp_path)
    run = plan(spec)[0]
    folder = run.last_checkpoint.parent
    folder.mkdir(parents=True)
    torch.save({}, folder / "round_2.ckpt")
    (folder / "round_3.ckpt").write_bytes(b"PK\x03\x04 cut short")
    run.last_checkpoint.symlink_to("round_4.ckpt")
    with pytest.warns(UserWarning, match="last.ckpt is dangling"):
        _, args = prepare(spec, run)
    assert args[-2:] == ["--ckpt_path", str(folder / "round_2.ckpt")]


def test_a_corrupt_state_file_counts_as_not_finished(tmp_path):
    run = plan(make_spec(tmp_path))[0]
    run.directory.mkdir(parents=True)
    run.state_file.write_text('{"arm": "keep", "seed"')
    assert RunState.load(run).status == "pending"


def test_the_config_check_names_the_bad_key(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    spec = make_spec(tmp_path)
    _, args = prepare(spec, plan(spec)[0])
    assert config_error(args[3:]) is None
    error = config_error([*args[3:], "--trainer.clients_per_rnd", "3"])
    assert error is not None and error.startswith("error:") and "clients_per_rnd" in error


@pytest.mark.parametrize(
    ("output", "code", "expected"),
    [
        ("Traceback (most recent call last):\n  File x\nValueError: `mu` must be >= 0\n", 1, "ValueError: `mu` must be >= 0"),
        (
            'usage: ...\nerror: Parser key "trainer.algorithm":\n  Does not validate\n  Subtypes: [A]\n  Given value: {}\n',
            2,
            'error: Parser key "trainer.algorithm": Does not validate',
        ),
        ("some output\n", -9, "killed by signal 9 (SIGKILL); last output: some output"),
        ("", 3, "exit code 3"),
    ],
)
def test_error_messages_are_the_last_exception_or_parser_error(output, code, expected):
    assert error_message(output, code) == expected


def fake_runs(monkeypatch, tmp_path, scripts: dict[str, str], workers: int = 1):
    """A study whose runs are ``python -c <script>`` (``{marker}`` is the run's completion marker)."""
    from fl_lightning.study import runner

    spec = make_spec(tmp_path, arms={name: {} for name in scripts}, workers=workers)
    monkeypatch.setattr(
        runner,
        "command",
        lambda spec, run, *, resume_from: [sys.executable, "-c", scripts[run.arm.name].format(marker=run.marker), "fit"],
    )
    return spec, runner.Launcher(spec)


def test_a_run_is_done_only_if_it_exits_0_and_wrote_its_marker(monkeypatch, tmp_path):
    spec, launcher = fake_runs(
        monkeypatch,
        tmp_path,
        {
            "finished": "open(r'{marker}', 'w').write('{{}}')",
            "stopped": "print('Received SIGTERM')",
            "crashed": "import sys; print('Traceback ...'); print('RuntimeError: out of memory'); sys.exit(1)",
        },
        workers=3,
    )
    states = {}
    launcher.run_all(plan(spec), lambda run, state: states.__setitem__(run.arm.name, state))
    assert {name: (s.status, s.error) for name, s in states.items()} == {
        "finished": ("done", None),
        "stopped": ("interrupted", "stopped before the end of fit (e.g. on SIGTERM)"),
        "crashed": ("failed", "RuntimeError: out of memory"),
    }
    assert [a["returncode"] for a in states["crashed"].attempts] == [1]
    assert "RuntimeError: out of memory" in plan(spec)[2].log_file.read_text()


def test_stopping_the_launcher_stops_its_runs(monkeypatch, tmp_path):
    import threading

    from ..waiting import CEILING, wait_for

    # The run would sleep for the whole ceiling: return code -15 shows the launcher stopped it.
    spec, launcher = fake_runs(monkeypatch, tmp_path, {"slow": f"import time; time.sleep({CEILING})"})
    states = []
    thread = threading.Thread(target=launcher.run_all, args=(plan(spec), lambda run, state: states.append(state)))
    thread.start()
    wait_for(lambda: bool(launcher.running), "the run to start")
    launcher.stop()
    thread.join(timeout=CEILING)
    assert [(s.status, s.attempts[0]["returncode"]) for s in states] == [("interrupted", -15)]


def test_wandb_mode_comes_from_the_environment_before_the_study(monkeypatch, tmp_path):
    from fl_lightning.study.runner import Launcher
    from fl_lightning.study.tracking import wandb_mode

    spec = make_spec(tmp_path, wandb={"project": "p", "mode": "offline"}, workers=2)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = Launcher(spec).environment()
    assert env["WANDB_MODE"] == wandb_mode(spec) == "offline" and int(env["OMP_NUM_THREADS"]) >= 1
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert Launcher(spec).environment()["WANDB_MODE"] == wandb_mode(spec) == "disabled"
