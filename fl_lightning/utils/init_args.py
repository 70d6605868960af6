"""Objects that remember their constructor arguments, and the flat hyper-parameters they make.

Every configurable piece of an experiment (algorithm, server optimizer, codec, partitioner,
participation and delay models, datasets, the datamodule) records the arguments it was built
with, from YAML or from Python alike, so the trainer can log the whole federated configuration
as flat keys that W&B groups and filters on::

    >>> from fl_lightning import FedAvg, ServerAdam
    >>> flat_hparams("fl/algorithm", FedAvg(server_optimizer=ServerAdam(lr=0.01)))["fl/algorithm.server_optimizer.lr"]
    0.01
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any

from torch import Tensor

#: A tensor argument with at most this many elements is logged by value, a larger one by shape.
_MAX_LOGGED_ELEMENTS = 16


class RecordsInitArgs:
    """Records the arguments of the constructor call that built the object (:attr:`init_args`).

    Defaults are filled in, and ``**kwargs`` are merged into the top level. Subclasses need
    nothing: the record is taken in ``__new__``, before any ``__init__`` runs.
    """

    _init_args: dict[str, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls)
        if cls.__init__ is object.__init__:  # nothing to record
            instance._init_args = {}
            return instance
        try:
            bound = inspect.signature(cls.__init__).bind(instance, *args, **kwargs)
        except TypeError:
            # copy, deepcopy and pickle call __new__ without arguments, then restore __dict__
            # (the record included); a wrong call fails in __init__ with Python's own message.
            return instance
        bound.apply_defaults()
        parameters = inspect.signature(cls.__init__).parameters
        recorded: dict[str, Any] = {}
        for position, (name, value) in enumerate(bound.arguments.items()):
            if position == 0:  # self
                continue
            if parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                recorded.update(value)
            else:
                recorded[name] = value
        instance._init_args = recorded
        return instance

    @property
    def init_args(self) -> dict[str, Any]:
        """The constructor's arguments by name, defaults included (empty if unknown)."""
        return dict(getattr(self, "_init_args", {}))


def flat_hparams(prefix: str, value: Any) -> dict[str, Any]:
    """``value`` as flat hyper-parameters under ``prefix``.

    An object that records its constructor arguments gives ``{prefix: class name}`` and each
    argument under ``prefix.<name>``, recursively; mappings and sequences of objects nest the
    same way (``prefix.<key>``, ``prefix.<index>``); numbers, strings, booleans, ``None`` and
    lists of them are kept; a small tensor becomes a list, a large one its shape and a hash of its
    values; anything else its class (or function) name. A ``None`` argument for which the
    constructor made a default object (``server_optimizer=None``) is described as that object.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return {prefix: value}
    if isinstance(value, RecordsInitArgs):
        flat: dict[str, Any] = {prefix: type(value).__name__}
        for name, argument in value.init_args.items():
            # ``server_optimizer=None`` stands for the default object the constructor made.
            default = getattr(value, name, None) if argument is None else None
            flat.update(flat_hparams(f"{prefix}.{name}", default if isinstance(default, RecordsInitArgs) else argument))
        return flat
    if isinstance(value, Tensor):
        if value.numel() <= _MAX_LOGGED_ELEMENTS:
            return {prefix: value.tolist()}
        digest = hashlib.sha256(value.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
        return {prefix: f"Tensor{list(value.shape)} sha256:{digest}"}  # a changed value shows
    if isinstance(value, Mapping):
        flat = {}
        for key, item in value.items():
            flat.update(flat_hparams(f"{prefix}.{key}", item))
        return flat
    if isinstance(value, (list, tuple)):
        if all(item is None or isinstance(item, (bool, int, float, str)) for item in value):
            return {prefix: list(value)}
        flat = {}
        for index, item in enumerate(value):
            flat.update(flat_hparams(f"{prefix}.{index}", item))
        return flat
    return {prefix: getattr(value, "__qualname__", type(value).__name__)}
