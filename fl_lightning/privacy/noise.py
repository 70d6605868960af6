"""Where differential-privacy noise comes from: the run's seed (reproducible research) or a secret (secure mode).

Noise that a logged value determines protects nobody who knows that value: the run's seed is logged
(``fl/seed``), saved in ``config.yaml`` and in every checkpoint, so from two consecutive global models
anyone holding it regenerates the noise and recovers the exact clipped sum (one client's update when
one client takes part), and Poisson sampling's membership is public, so it amplifies nothing.
:class:`SecretNoise` draws instead from SHAKE-256 (FIPS 202, an extendable-output function) keyed by
256 bits from the operating system's CSPRNG (:func:`secrets.token_bytes`), drawn when a fit starts
and never logged or saved; under client sharding rank 0 draws it and broadcasts it once, so every
rank adds the same noise. Gaussians are formed from its 53-bit uniforms by Box–Muller, each the sum of
four draws over 2 (Holohan & Braghin 2021, "Secure Random Sampling in Differential Privacy", §5.1, as
Opacus's secure mode does), so the low bits of a released float no longer give away the draw
(the floating-point attacks of Mironov 2012 and Jin et al. 2022).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from abc import ABC, abstractmethod
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from fl_lightning.utils.seeding import make_generator


class NoiseSource(ABC):
    """A stream of random draws, consumed in order."""

    @abstractmethod
    def uniform(self, size: int) -> Tensor:
        """``size`` float64 draws from the uniform distribution on [0, 1)."""

    @abstractmethod
    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
        """Standard normal draws of ``shape`` in ``dtype``."""


class SeededNoise(NoiseSource):
    """Draws from a seeded ``torch.Generator`` (reproducible: the same seed gives the same noise)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    @override
    def uniform(self, size: int) -> Tensor:
        return torch.rand(size, generator=self.generator, dtype=torch.float64)

    @override
    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
        return torch.randn(shape, generator=self.generator, dtype=dtype)


class SecretNoise(NoiseSource):
    """Draws from SHAKE-256 keyed by ``secret`` and ``keys`` (e.g. ``("dp_noise", round)``), one
    counter-mode block per draw, so no logged or checkpointed value determines them."""

    def __init__(self, secret: bytes, *keys: int | str) -> None:
        self._prefix = secret + repr(keys).encode()
        self._draws = 0

    def _bits53(self, size: int) -> Tensor:
        if not size:
            return torch.zeros(0, dtype=torch.int64)
        block = hashlib.shake_256(self._prefix + self._draws.to_bytes(8, "little")).digest(8 * size)
        self._draws += 1
        return torch.frombuffer(bytearray(block), dtype=torch.int64) & ((1 << 53) - 1)

    @override
    def uniform(self, size: int) -> Tensor:
        return self._bits53(size).double() * 2.0**-53

    @override
    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
        size = math.prod(shape)
        total = sum((self._box_muller(size) for _ in range(4)), torch.zeros(size, dtype=torch.float64))
        return (total / 2).view(shape).to(dtype)  # four standard normals over 2: std 1

    def _box_muller(self, size: int) -> Tensor:
        """``size`` standard normals from ``2 * ceil(size / 2)`` uniforms in (0, 1)."""
        pairs = (size + 1) // 2
        u = (self._bits53(2 * pairs).double() + 0.5) * 2.0**-53  # in (0, 1): the log below is finite
        radius, angle = torch.sqrt(-2 * torch.log(u[:pairs])), 2 * math.pi * u[pairs:]
        return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:size]


def start_noise(owner: str, secure_mode: bool, what: str = "") -> bytes | None:
    """At the start of a fit: the secret of a secure-mode run (:func:`draw_secret`), or ``None`` after
    the one warning that the seed determines the noise (``what`` says which draws besides the noise)."""
    if secure_mode:
        return draw_secret()
    rank_zero_warn(
        f"{owner}(secure_mode=False) draws its noise{what} from the run's seed, which is logged and checkpointed: "
        "whoever knows the seed can regenerate the noise and strip it from the released models. Fine for reproducible "
        "research; set secure_mode=True before publishing or deploying a privacy guarantee."
    )
    return None


def noise_source(secret: bytes | None, seed: int, *keys: int | str) -> NoiseSource:
    """The draws named ``(seed, *keys)``: from ``secret`` in secure mode, else from the seeded generator."""
    if secret is None:
        return SeededNoise(make_generator(seed, *keys))
    return SecretNoise(secret, seed, *keys)


def check_secure_mode(secure_mode: bool) -> bool:
    """``secure_mode``, checked to be a bool."""
    if not isinstance(secure_mode, bool):
        raise TypeError(f"`secure_mode` must be True or False, got {secure_mode!r}.")
    return secure_mode


def draw_secret() -> bytes:
    """256 bits from the OS's CSPRNG; under ``torch.distributed`` rank 0's, broadcast to every rank."""
    return rank_zero_value(secrets.token_bytes(32))


def rank_zero_value(value: Any) -> Any:
    """``value`` as rank 0 has it, broadcast to every rank under ``torch.distributed`` (else ``value``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        shared = [value]
        torch.distributed.broadcast_object_list(shared, src=0)
        return shared[0]
    return value
