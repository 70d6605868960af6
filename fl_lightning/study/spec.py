"""The study file: arms x seeds of ``fl-lightning fit`` runs, and how to report them."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader

from fl_lightning.utils.metric_names import MODES

#: How a run's per-round series of a metric becomes one number in the summary table.
REDUCTIONS = ("final", "mean", "min", "max", "sum")
#: The keys a run's seed is written to unless the study lists its own ``seed_keys``.
DEFAULT_SEED_KEYS = ("seed_everything", "trainer.seed")
WANDB_MODES = ("online", "offline", "disabled")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class WandbSpec:
    """Where a study's runs go in Weights & Biases.

    Args:
        project: the W&B project.
        entity: the W&B team or user (default: the logged-in user's default entity).
        tags: tags on every run of the study (the arm's name and ``seed:<n>`` are added).
        mode: ``online``, ``offline`` or ``disabled``; ``WANDB_MODE`` in the environment overrides it (default: online).
    """

    project: str
    entity: str | None = None
    tags: tuple[str, ...] = ()
    mode: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.project, str) or not self.project:
            raise ValueError(f"`wandb.project` must be a non-empty string, got {self.project!r}.")
        if self.mode is not None and self.mode not in WANDB_MODES:
            raise ValueError(f"`wandb.mode` must be one of {', '.join(WANDB_MODES)}, got {self.mode!r}.")


@dataclass(frozen=True)
class Arm:
    """One configuration of a study: config files layered on the base, then overrides.

    Args:
        name: the arm's name (its directory, and its W&B ``job_type``).
        configs: extra ``fl-lightning`` config files, applied after the study's base.
        overrides: nested config values applied last (after the study-wide overrides).
    """

    name: str
    configs: tuple[Path, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StudySpec:
    """A comparison study: every arm is run with every seed.

    Args:
        name: the study's name: its directory under ``directory``'s default and the W&B ``group``.
        arms: the arms, in table and legend order.
        seeds: the seeds every arm runs with.
        base: ``fl-lightning`` config files every arm starts from.
        overrides: config values applied to every arm, before the arm's own.
        seed_keys: dotted config keys that receive the run's seed.
        monitor: the metric the table reports the best value of, and rounds to ``target_accuracy`` for
            (a name the module logs, e.g. ``val_acc``); default: the runs' ``ModelCheckpoint``/``EarlyStopping``
            monitor, else none (every validation metric's final value only).
        mode: ``"max"`` or ``"min"``: how ``monitor`` improves; required with ``monitor``.
        target_accuracy: the value of ``monitor`` whose first crossing the table reports as "rounds to target":
            reached at ``>=`` with ``mode: max``, ``<=`` with ``mode: min`` (any finite number, e.g. a perplexity).
        metrics: extra table columns: logged metric name -> reduction over rounds (one of :data:`REDUCTIONS`).
        workers: runs in flight at once (each its own process).
        directory: the study directory (default ``studies/<name>``, relative to the working directory).
        wandb: W&B settings; ``None`` logs CSV only.
        plots: whether to draw the PNG plots (needs the ``plots`` extra, i.e. matplotlib).
        source: the study file this spec was read from, if any.
    """

    name: str
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    base: tuple[Path, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    seed_keys: tuple[str, ...] = DEFAULT_SEED_KEYS
    monitor: str | None = None
    mode: str | None = None
    target_accuracy: float | None = None
    metrics: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    directory: Path | None = None
    wandb: WandbSpec | None = None
    plots: bool = True
    source: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SAFE_NAME.match(self.name):
            raise ValueError(f"Study `name` must be letters, digits, '.', '_' or '-' (a directory name), got {self.name!r}.")
        if not self.arms:
            raise ValueError("A study needs at least one arm under `arms`.")
        names = [arm.name for arm in self.arms]
        for arm in names:
            if not isinstance(arm, str) or not _SAFE_NAME.match(arm):
                raise ValueError(f"Arm names must be letters, digits, '.', '_' or '-', got {arm!r}.")
        if len(set(names)) != len(names):
            raise ValueError(f"Arm names must be distinct, got {names}.")
        if not self.seeds:
            raise ValueError("A study needs at least one seed under `seeds`.")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ValueError(f"Seeds must be integers >= 0, got {seed!r}.")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"Seeds must be distinct, got {list(self.seeds)}.")
        if not self.seed_keys:
            raise ValueError("`seed_keys` must name at least one config key (e.g. `seed_everything`).")
        if self.monitor is not None and (not isinstance(self.monitor, str) or not self.monitor):
            raise ValueError(f"`monitor` must be a logged metric's name, got {self.monitor!r}.")
        if (self.monitor is None) != (self.mode is None) or (self.mode is not None and self.mode not in MODES):
            raise ValueError(
                f"`monitor` and `mode` go together, mode one of {list(MODES)} (how the metric improves); "
                f"got monitor={self.monitor!r}, mode={self.mode!r}."
            )
        target = self.target_accuracy
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target)):
            # Any finite value of the monitored metric: an accuracy with `mode: max`, a loss or perplexity with `min`.
            raise ValueError(f"`target_accuracy` must be a finite number (a value of `monitor`), got {target!r}.")
        if target is not None and self.monitor is None:
            raise ValueError(f"`target_accuracy: {target}` needs `monitor` (the metric to reach it) and `mode`.")
        for metric, reduction in self.metrics.items():
            if reduction not in REDUCTIONS:
                raise ValueError(f"Metric {metric!r}: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}.")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"`workers` must be an integer >= 1, got {self.workers!r}.")
        for path in self.base + tuple(p for arm in self.arms for p in arm.configs):
            if not path.is_file():
                raise ValueError(f"Config file {str(path)!r} does not exist (relative paths are relative to the study file).")

    @property
    def study_dir(self) -> Path:
        return self.directory if self.directory is not None else Path("studies") / self.name

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"No arm named {name!r}; the study has {[a.name for a in self.arms]}.")

    def with_options(self, *, arms: Sequence[str] | None = None, **changes: Any) -> StudySpec:
        """A copy with some fields changed (``None`` values are ignored) and optionally a subset of the arms."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if "seeds" in changes:
            changes["seeds"] = tuple(changes["seeds"])
        if "directory" in changes:
            changes["directory"] = Path(changes["directory"])
        if arms is not None:
            changes["arms"] = tuple(self.arm(name) for name in arms)
        return replace(self, **changes)

    def fingerprint(self, arm: Arm, seed: int) -> str:
        """A digest of everything that defines run ``(arm, seed)``: configs' text, overrides, seed keys."""
        payload = {
            "configs": [p.read_text() for p in self.base + arm.configs],
            "overrides": [self.overrides, arm.overrides],
            "seed": seed,
            "seed_keys": list(self.seed_keys),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (paths as strings), e.g. for the W&B summary run's config."""
        data = asdict(self)
        return json.loads(json.dumps(data, default=str))


def expand_dotted(values: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dicts from keys that may be dotted: ``{"trainer.max_epochs": 5}`` -> ``{"trainer": {"max_epochs": 5}}``.

    Example:
        >>> expand_dotted({"trainer.max_epochs": 5, "trainer": {"seed": 1}})
        {'trainer': {'max_epochs': 5, 'seed': 1}}
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and not _is_class_spec(value):
            value = expand_dotted(value)
        *parents, leaf = str(key).split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"Override {key!r} conflicts with a non-mapping value at {part!r}.")
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = merge(node[leaf], value)
        else:
            node[leaf] = value
    return out


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``update`` wins on leaves."""
    out = dict(base)
    for key, value in update.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


def _is_class_spec(value: Mapping[str, Any]) -> bool:
    # ``{class_path, init_args}`` values are kept as written: their keys are never dotted paths.
    return "class_path" in value


def load_yaml(text: str) -> Any:
    """YAML read as ``fl-lightning``'s parser (jsonargparse) reads it: ``1e-3`` is a float, dates stay strings."""
    return get_loader("yaml")(text)


class _ConfigDumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML leaves e.g. "1e5" (a W&B id) unquoted, and jsonargparse would read it as a float.
    quote = load_yaml(value) != value
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if quote else None)


_ConfigDumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    """YAML that ``fl-lightning``'s parser reads back as ``data``."""
    return yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False, allow_unicode=True)


def load_study(path: str | Path) -> StudySpec:
    """Reads a study file (see ``docs/comparing.md``); config paths in it are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Study file {str(path)!r} does not exist.")
    data = load_yaml(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"Study file {str(path)!r} must hold a mapping, got {type(data).__name__}.")
    return study_from_dict(data, root=path.parent, source=path)


_KNOWN_KEYS = {
    "name", "arms", "seeds", "base", "overrides", "seed_keys", "monitor", "mode", "target_accuracy",
    "metrics", "workers", "directory", "wandb", "plots",
}  # fmt: skip


def study_from_dict(data: Mapping[str, Any], *, root: Path = Path("."), source: Path | None = None) -> StudySpec:
    """A :class:`StudySpec` from a study file's contents; relative config paths are resolved against ``root``."""
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"Unknown study key(s) {unknown}; allowed: {sorted(_KNOWN_KEYS)}.")
    for key in ("name", "arms", "seeds"):
        if key not in data:
            raise ValueError(f"The study file needs `{key}`.")
    arms_data = data["arms"]
    if not isinstance(arms_data, Mapping):
        raise ValueError(f"`arms` must map arm names to overrides, got {type(arms_data).__name__}.")
    arms = []
    for name, arm in arms_data.items():
        arm = dict(arm or {})
        configs = arm.pop("config", [])
        arms.append(Arm(name=str(name), configs=_paths(configs, root), overrides=expand_dotted(arm)))
    seeds = data["seeds"]
    seeds = tuple(seeds) if isinstance(seeds, (list, tuple)) else (seeds,)
    wandb = data.get("wandb")
    if wandb is not None and not isinstance(wandb, Mapping):
        raise ValueError(f"`wandb` must be a mapping such as `{{project: my-project}}`, got {wandb!r}.")
    target = data.get("target_accuracy")
    return StudySpec(
        name=data["name"],
        arms=tuple(arms),
        seeds=seeds,
        base=_paths(data.get("base", []), root),
        overrides=expand_dotted(data.get("overrides") or {}),
        seed_keys=tuple(data.get("seed_keys", DEFAULT_SEED_KEYS)),
        monitor=data.get("monitor"),
        mode=data.get("mode"),
        target_accuracy=float(target) if isinstance(target, int) and not isinstance(target, bool) else target,
        metrics=_metrics(data.get("metrics") or {}),
        workers=data.get("workers", 1),
        directory=Path(data["directory"]) if data.get("directory") else None,
        wandb=WandbSpec(**{**wandb, "tags": tuple(wandb.get("tags") or ())}) if wandb else None,
        plots=bool(data.get("plots", True)),
        source=source,
    )


def _paths(value: str | Sequence[str], root: Path) -> tuple[Path, ...]:
    values = [value] if isinstance(value, (str, Path)) else list(value)
    return tuple((root / v).resolve() for v in values)


def _metrics(value: Mapping[str, str] | Sequence[str]) -> dict[str, str]:
    # A bare name is reported as its mean over rounds.
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    return {str(name): "mean" for name in value}
