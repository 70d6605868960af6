"""Compute-speed models for asynchronous FL: how long a client's job takes, in virtual seconds.

The ``k``-th job of client ``c`` draws its duration from the stream ``(seed, "delay", c, k)``, so
the arrival sequence depends only on the seed and the dispatch pattern, never on the algorithm
or the model: FedBuff and FedStaleWeight runs with one seed see the same event trace.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from fl_lightning.participation._participation_checks import check_int, per_client
from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.seeding import make_generator

Value = float | Sequence[float]


def _positive(owner: str, name: str, value: Value, *, allow_zero: bool = False) -> float | tuple[float, ...]:
    return _finite(owner, name, value, above=">= 0" if allow_zero else "> 0")


def _finite(owner: str, name: str, value: Value, *, above: str = "") -> float | tuple[float, ...]:
    """``value`` (one or per-client values) as floats, or ``ValueError`` unless each is finite and ``above``
    (``""``, ``"> 0"`` or ``">= 0"``)."""
    values = [value] if isinstance(value, numbers.Real) else list(value)
    if not values:
        raise ValueError(f"{owner}: `{name}` is empty.")
    for v in values:
        real = isinstance(v, numbers.Real) and math.isfinite(v)
        if not real or (above == "> 0" and not v > 0) or (above == ">= 0" and not v >= 0):
            raise ValueError(f"{owner}: `{name}` must be {above + ' and ' if above else ''}finite, got {v!r}.")
    return float(value) if isinstance(value, numbers.Real) else tuple(float(v) for v in values)


class DelayModel(RecordsInitArgs, ABC):
    """Duration of each client job (dispatch to arrival) in virtual seconds; always > 0."""

    num_clients = 0
    seed = 0
    #: Attributes that may hold one value per client, checked against the federation at setup.
    per_client_fields: tuple[str, ...] = ()

    def setup(self, *, num_clients: int, seed: int) -> None:
        """Binds the model to the federation once, before the first dispatch."""
        self.num_clients = check_int("num_clients", num_clients, minimum=1)
        self.seed = seed
        for name in self.per_client_fields:
            per_client(type(self).__name__, name, getattr(self, name), num_clients)

    def duration(self, client: int, job: int) -> float:
        """Duration of client ``client``'s ``job``-th job (both 0-based)."""
        value = self._duration(client, job, make_generator(self.seed, "delay", client, job))
        if not value > 0:
            raise RuntimeError(f"{type(self).__name__} returned a non-positive duration {value} for client {client}.")
        return value

    @abstractmethod
    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        """The duration; ``generator`` is this job's own stream."""

    def _per_client(self, name: str, value: float | tuple[float, ...]) -> tuple[float, ...]:
        return per_client(type(self).__name__, name, value, self.num_clients)


class ConstantDelay(DelayModel):
    """Fixed durations, one value or one per client."""

    per_client_fields = ("value",)

    def __init__(self, duration: Value = 1.0) -> None:
        self.value = _positive("ConstantDelay", "duration", duration)

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        return self._per_client("duration", self.value)[client]


class UniformDelay(DelayModel):
    """Durations uniform in ``[low, high]`` (the paper: fast clients U(1, 2), slow U(8, 12))."""

    per_client_fields = ("low", "high")

    def __init__(self, low: Value = 1.0, high: Value = 2.0) -> None:
        self.low = _positive("UniformDelay", "low", low)
        self.high = _positive("UniformDelay", "high", high)

    def setup(self, *, num_clients: int, seed: int) -> None:
        super().setup(num_clients=num_clients, seed=seed)
        for client, (lo, hi) in enumerate(zip(self._per_client("low", self.low), self._per_client("high", self.high))):
            if lo > hi:
                raise ValueError(f"UniformDelay: low={lo} > high={hi} for client {client}.")

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        lo, hi = self._per_client("low", self.low)[client], self._per_client("high", self.high)[client]
        return lo + (hi - lo) * float(torch.rand((), generator=generator, dtype=torch.float64))


class ExponentialDelay(DelayModel):
    """Exponential durations with the given mean (memoryless client availability)."""

    per_client_fields = ("mean",)

    def __init__(self, mean: Value = 1.0) -> None:
        self.mean = _positive("ExponentialDelay", "mean", mean)

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        return -self._per_client("mean", self.mean)[client] * math.log1p(-u) or math.ulp(0.0)


class LogNormalDelay(DelayModel):
    """Log-normal durations: ``exp(N(mu, sigma^2))`` (heavy-tailed stragglers)."""

    per_client_fields = ("mu", "sigma")

    def __init__(self, mu: Value = 0.0, sigma: Value = 0.5) -> None:
        self.mu = _finite("LogNormalDelay", "mu", mu)
        self.sigma = _positive("LogNormalDelay", "sigma", sigma, allow_zero=True)

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        z = float(torch.randn((), generator=generator, dtype=torch.float64))
        mu = per_client("LogNormalDelay", "mu", self.mu, self.num_clients)[client]
        return math.exp(mu + self._per_client("sigma", self.sigma)[client] * z)


class TraceDelay(DelayModel):
    """Trace-driven durations: client ``c`` replays ``traces[c % len(traces)]`` in order, cyclically."""

    def __init__(self, traces: Sequence[Sequence[float]]) -> None:
        if not traces:
            raise ValueError("TraceDelay: `traces` is empty.")
        self.traces = [_positive("TraceDelay", f"traces[{i}]", list(t)) for i, t in enumerate(traces)]

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        trace = self.traces[client % len(self.traces)]
        assert isinstance(trace, tuple)
        return trace[job % len(trace)]


class DelayGroups(DelayModel):
    """Consecutive groups of clients with their own models, e.g. 10 fast U(1,2) then 5 slow U(8,12).

    The groups are also offered to federated evaluation (:meth:`client_groups`) under ``names``
    (default ``group0``, ``group1``, ...), e.g. ``names=["fast", "slow"]``.
    """

    def __init__(self, sizes: Sequence[int], models: Sequence[DelayModel], names: Sequence[str] | None = None) -> None:
        if len(sizes) != len(models) or not sizes:
            raise ValueError(f"DelayGroups needs one model per group size, got {len(sizes)} sizes and {len(models)} models.")
        if names is not None and (len(names) != len(sizes) or len(set(names)) != len(names)):
            raise ValueError(f"DelayGroups needs one distinct name per group ({len(sizes)} groups), got names={list(names)!r}.")
        self.sizes = [check_int("sizes[i]", s, minimum=1) for s in sizes]
        self.models = list(models)
        self.names = [f"group{g}" for g in range(len(sizes))] if names is None else list(names)

    def client_groups(self) -> dict[str, list[int]]:
        """``{name: client ids}`` of every group, in client order."""
        offsets = [sum(self.sizes[:g]) for g in range(len(self.sizes))]
        return {name: list(range(offset, offset + size)) for name, offset, size in zip(self.names, offsets, self.sizes)}

    def setup(self, *, num_clients: int, seed: int) -> None:
        super().setup(num_clients=num_clients, seed=seed)
        if sum(self.sizes) != num_clients:
            raise ValueError(f"DelayGroups sizes {self.sizes} sum to {sum(self.sizes)}, not num_clients={num_clients}.")
        for size, model in zip(self.sizes, self.models):
            model.setup(num_clients=size, seed=seed)
        self._offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]

    def group_of(self, client: int) -> int:
        """Index of the group holding ``client``."""
        return max(i for i, offset in enumerate(self._offsets) if offset <= client)

    def _duration(self, client: int, job: int, generator: torch.Generator) -> float:
        group = self.group_of(client)
        return self.models[group]._duration(client - self._offsets[group], job, generator)
