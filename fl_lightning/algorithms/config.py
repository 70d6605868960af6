"""Constructor arguments as configuration: what distinguishes two algorithms (or server optimizers).

:class:`Configurable` records the arguments an object was constructed with. :func:`config_of`
turns any object into its nested configuration, in the ``class_path`` / ``init_args`` form of a
LightningCLI YAML file, and :func:`flat_config` flattens it into ``name.arg`` keys for loggers
and checkpoint fingerprints::

    >>> from fl_lightning import FedAvg, ServerAdam
    >>> flat_config(FedAvg(server_optimizer=ServerAdam(lr=0.05)), "algorithm")["algorithm.server_optimizer.lr"]
    0.05
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

_PRIMITIVES = (bool, int, float, str, type(None))


class Configurable:
    """Records the arguments of the outermost constructor call, with defaults applied.

    They are recorded in ``__new__``, before ``__init__`` runs, so subclasses need no cooperation
    and ``super().__init__(...)`` calls do not overwrite them; ``**kwargs`` are merged in. A
    ``None`` argument that ``__init__`` replaced by a default object of the same attribute name
    (``server_optimizer=None`` -> ``self.server_optimizer = ServerSGD()``) reads as that object;
    arguments passed through ``**kwargs`` appear only when given (their defaults are the parent's).
    """

    _init_args: dict[str, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        signature = inspect.signature(cls.__init__)
        # bind_partial: copy/pickle call __new__ without arguments, then restore __dict__.
        bound = signature.bind_partial(None, *args, **kwargs)
        bound.apply_defaults()
        recorded: dict[str, Any] = {}
        for name, parameter in list(signature.parameters.items())[1:]:
            if name not in bound.arguments:
                continue
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                recorded.update(bound.arguments[name])
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                recorded[name] = bound.arguments[name]
        self._init_args = recorded
        return self

    def hparams(self) -> dict[str, Any]:
        """The constructor arguments, nested objects as ``{"class_path", "init_args"}`` (see :func:`config_of`)."""
        return {name: config_of(self._resolved(name, value)) for name, value in self._init_args.items()}

    def _resolved(self, name: str, value: Any) -> Any:
        if value is not None:
            return value
        # Only a default *object* stands in for None: plain values and containers of the same
        # name may be state that changes during training (FedSoft's centres, FedBuff's concurrency).
        default = getattr(self, name, None)
        plain = isinstance(default, (*_PRIMITIVES, Mapping, list, tuple, torch.Tensor, np.ndarray))
        return None if plain else default


def config_of(obj: Any) -> Any:
    """The configuration of ``obj``: primitives as they are, containers element-wise, tensors and
    arrays as ``"Tensor[shape] sha256:..."`` (so a changed value shows), other objects as
    ``{"class_path": ..., "init_args": ...}``.

    A :class:`Configurable` reports its recorded arguments; any other object the constructor
    parameters that it keeps as attributes of the same name (others are left out).
    """
    if isinstance(obj, _PRIMITIVES):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): config_of(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [config_of(v) for v in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return _array_summary(obj)
    init_args = obj.hparams() if isinstance(obj, Configurable) else _attribute_args(obj)
    return {"class_path": f"{type(obj).__module__}.{type(obj).__qualname__}", "init_args": init_args}


def _attribute_args(obj: Any) -> dict[str, Any]:
    try:
        parameters = list(inspect.signature(type(obj).__init__).parameters.values())[1:]
    except (TypeError, ValueError):  # a builtin or extension type: nothing to introspect
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: config_of(getattr(obj, p.name)) for p in parameters if p.kind in kinds and hasattr(obj, p.name)}


def _array_summary(array: torch.Tensor | np.ndarray) -> str:
    values = array.detach().cpu().contiguous().numpy() if isinstance(array, torch.Tensor) else np.ascontiguousarray(array)
    digest = hashlib.sha256(values.tobytes()).hexdigest()[:16]
    return f"{type(array).__name__}{list(values.shape)} {values.dtype} sha256:{digest}"


def flat_config(obj: Any, prefix: str) -> dict[str, Any]:
    """:func:`config_of` flattened to ``prefix.arg.subarg`` keys; an object's own key holds its
    class name (``{"algorithm": "FedAvg", "algorithm.server_optimizer": "ServerAdam", ...}``)."""
    return _flatten(config_of(obj), prefix)


def _flatten(config: Any, prefix: str) -> dict[str, Any]:
    if isinstance(config, dict) and set(config) == {"class_path", "init_args"}:
        flat: dict[str, Any] = {prefix: config["class_path"].rsplit(".", 1)[-1]}
        for name, value in config["init_args"].items():
            flat.update(_flatten(value, f"{prefix}.{name}"))
        return flat
    if isinstance(config, dict):
        return {k: v for name, value in config.items() for k, v in _flatten(value, f"{prefix}.{name}").items()}
    if isinstance(config, list):
        if all(isinstance(v, _PRIMITIVES) for v in config):
            return {prefix: list(config)}
        return {k: v for i, value in enumerate(config) for k, v in _flatten(value, f"{prefix}.{i}").items()}
    return {prefix: config}
