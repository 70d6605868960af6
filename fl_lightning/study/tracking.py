"""Weights & Biases for studies: each run's ``WandbLogger`` settings, and the study's summary run."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fl_lightning.study.spec import StudySpec


def wandb_mode(spec: StudySpec) -> str | None:
    """The W&B mode of the study's runs: ``WANDB_MODE`` if set, else the study's ``wandb.mode`` (else W&B's default)."""
    return os.environ.get("WANDB_MODE") or (spec.wandb.mode if spec.wandb is not None else None)


def wandb_logger_config(spec: StudySpec, arm: str, seed: int, run_id: str, directory: Path) -> dict[str, Any]:
    """The ``WandbLogger`` of run ``(arm, seed)``: group = the study, job_type = the arm.

    The run id is fixed at the run's first attempt, so a resumed run continues the same W&B run.
    """
    assert spec.wandb is not None
    init_args: dict[str, Any] = {
        "project": spec.wandb.project,
        "name": f"{arm}-seed{seed}",
        "id": run_id,
        "save_dir": str(directory),
        "group": spec.name,
        "job_type": arm,
        "tags": [*spec.wandb.tags, arm],
        "config": {"study": {"name": spec.name, "arm": arm, "seed": seed}},
    }
    if spec.wandb.entity is not None:
        init_args["entity"] = spec.wandb.entity
    return {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": init_args}


def log_summary_run(
    spec: StudySpec,
    study_dir: Path,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    images: Mapping[str, Path],
) -> None:
    """Logs the summary table (a ``wandb.Table``) and the plots to the study's summary run.

    The summary run is in the study's group with ``job_type="summary"``; its id is kept in
    ``<study>/wandb_summary_id`` so that re-running the study updates the same run.
    """
    assert spec.wandb is not None
    import wandb

    id_file = study_dir / "wandb_summary_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
    id_file.write_text(run_id)
    init: dict[str, Any] = {
        "project": spec.wandb.project,
        "group": spec.name,
        "job_type": "summary",
        "name": f"{spec.name}-summary",
        "tags": [*spec.wandb.tags, "summary"],
        "id": run_id,
        "resume": "allow",
        "dir": str(study_dir),
        "config": {"study": spec.to_dict()},
    }
    if spec.wandb.entity is not None:
        init["entity"] = spec.wandb.entity
    if (mode := wandb_mode(spec)) is not None:
        init["mode"] = mode
    run = wandb.init(**init)
    try:
        payload: dict[str, Any] = {"summary_table": wandb.Table(columns=list(columns), data=[list(r) for r in rows])}
        payload.update({f"plots/{name}": wandb.Image(str(path)) for name, path in images.items()})
        run.log(payload)
    finally:
        run.finish()
