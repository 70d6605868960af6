r"""DRIVE (Vargaftik et al., NeurIPS 2021) and EDEN (Vargaftik et al., ICML 2022): randomized Hadamard
rotation, deterministic quantisation of the rotated coordinates, one unbiasing scale per tensor."""

from __future__ import annotations

import functools
import math
import struct
from abc import abstractmethod

import torch
from torch import Tensor

from fl_lightning.compression.codec import UpdateCodec
from fl_lightning.compression.hadamard import padded_length, rotate, unrotate
from fl_lightning.compression.wire import PayloadError, TensorSpec, pack_bits, unpack_bits

#: Per-tensor section head: the rotation seed (``uint64``) and the scale (``float32``).
_HEAD = struct.Struct("<Qf")
_SEED_BOUND = 2**63 - 1


class RotatedQuantizationCodec(UpdateCodec):
    r"""Each tensor :math:`x` (flat, :math:`d` elements) is zero-padded to :math:`D = 2^{\lceil \log_2 d \rceil}`,
    rotated (:math:`R x`, :mod:`~fl_lightning.compression.hadamard`), and every coordinate of the
    normalised :math:`z = \sqrt{D}\, R x / \lVert x \rVert` is mapped to its nearest level
    :math:`q(z)` of :attr:`levels` (:math:`2^b` values, :math:`b` bits each). The server decodes

    .. math:: \hat x = S\, R^{-1} q(z), \qquad S = \frac{\lVert x \rVert_2^2}{\langle R x, q(z) \rangle},

    so :math:`\langle \hat x, x \rangle = \lVert x \rVert^2` exactly, and :math:`E[\hat x] = x` for a
    uniformly random rotation (both papers' unbiasedness theorems). Both papers run the randomized
    Hadamard rotation instead, for which unbiasedness is only approximate: small or adversarial
    inputs keep a bias, e.g. ``(a, b)`` with :math:`a > |b| > 0` always decodes to
    :math:`((a^2 + b^2)/a, 0)`; for large :math:`d` and typical deltas the bias is negligible.

    Section: rotation seed (``uint64``, drawn from the client's compression generator), scale
    (``float32``), then :math:`D b` bits, LSB-first per index: :math:`12 + \lceil D b / 8 \rceil` bytes.
    The rotated padding is not zero, so the codec pays for :math:`D`, not :math:`d`, coordinates:
    up to :math:`2\times` the bits for a :math:`d` just above a power of two.
    """

    #: Bits per rotated coordinate.
    bits: int

    @property
    @abstractmethod
    def levels(self) -> Tensor:
        """The :math:`2^b` increasing quantisation levels of the normalised rotated coordinates."""

    def section_size(self, spec: TensorSpec) -> int:
        return _HEAD.size + (padded_length(spec.numel) * self.bits + 7) // 8

    def encode_tensor(self, x: Tensor, generator: torch.Generator | None) -> bytes:
        seed = int(torch.randint(_SEED_BOUND, (), generator=generator, device=x.device))
        rotated = rotate(x, seed)
        norm_sq = float(x.square().sum())
        z = rotated * (math.sqrt(rotated.numel() / norm_sq) if norm_sq > 0 else 1.0)
        levels = self.levels.to(x.device)
        # Nearest level: boundaries are the midpoints; z on a boundary goes up (sign(0) = +1).
        index = torch.bucketize(z, (levels[1:] + levels[:-1]) / 2, right=True)
        dot = float((rotated * levels[index]).sum())
        scale = norm_sq / dot if norm_sq > 0 else 0.0
        planes = (index.unsqueeze(1) >> torch.arange(self.bits, device=x.device)) & 1
        return _HEAD.pack(seed, scale) + pack_bits(planes.bool()).cpu().numpy().tobytes()

    def decode_tensor(self, section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
        seed, scale = _HEAD.unpack_from(section)
        if not 0 <= scale < math.inf:
            raise PayloadError(f"{type(self).__name__} scale of {spec.name!r} must be finite and >= 0, got {scale}.")
        length = padded_length(spec.numel)
        packed = torch.frombuffer(bytearray(section[_HEAD.size :]), dtype=torch.uint8).to(device)
        planes = unpack_bits(packed, length * self.bits).view(length, self.bits).long()
        index = (planes << torch.arange(self.bits, device=device)).sum(dim=1)
        return unrotate(scale * self.levels.to(device)[index], seed)[: spec.numel]


class DriveCodec(RotatedQuantizationCodec):
    r"""DRIVE, unbiased variant: :math:`\hat x = S\, R^{-1} \operatorname{sign}(R x)` with
    :math:`S = \lVert x \rVert_2^2 / \lVert R x \rVert_1` (DRIVE's unbiased scale, the variant for
    distributed mean estimation; its biased :math:`S = \lVert R x \rVert_1 / D` minimises one vector's
    error, not the mean's).

    One bit per padded coordinate plus 96 bits per tensor; :math:`\operatorname{sign}(0) = +1`.
    """

    codec_id = 6
    bits = 1

    @property
    def levels(self) -> Tensor:
        return torch.tensor([-1.0, 1.0])


class EdenCodec(RotatedQuantizationCodec):
    r"""EDEN with deterministic :math:`b`-bit quantisation: the levels are the Lloyd–Max centroids of
    :math:`\mathcal N(0, 1)`, the limiting distribution of the normalised rotated coordinates, and
    the unbiased scale :math:`S = \lVert x \rVert^2 / \langle R x, Q(R x) \rangle` (EDEN's
    deterministic-quantisation variant; levels as the authors' ``max_lloyd`` tables).

    At :math:`b = 1` the levels are :math:`\pm\sqrt{2/\pi}` and the level's magnitude cancels in
    :math:`S\,Q(Rx)`, so EDEN decodes as unbiased DRIVE (up to float32 rounding) (EDEN generalises DRIVE; the
    authors' code implements DRIVE as EDEN at 1 bit); it keeps its own ``codec_id``. Choices: integer :math:`b \le 4` only (no
    randomized-rounding or sparsified fractional bit rates); the levels are not sent (the server
    derives them from ``bits``).

    Args:
        bits: bits per padded coordinate, 1 to 4 (the FedMRN paper's comparison: 1).
    """

    codec_id = 7

    def __init__(self, *, bits: int = 1) -> None:
        if bits not in (1, 2, 3, 4):
            raise ValueError(f"`bits` must be 1, 2, 3 or 4, got {bits!r}.")
        self.bits = bits

    @property
    def levels(self) -> Tensor:
        return torch.tensor(normal_lloyd_max(self.bits), dtype=torch.float32)


@functools.cache
def normal_lloyd_max(bits: int, *, tol: float = 1e-12, max_iter: int = 100_000) -> tuple[float, ...]:
    r"""The :math:`2^b` MSE-optimal levels for :math:`\mathcal N(0, 1)` (Lloyd's algorithm; Max 1960).

    Alternates boundaries at the levels' midpoints and levels at the conditional means
    :math:`(\varphi(a) - \varphi(b)) / (\Phi(b) - \Phi(a))` of their cells.

    >>> [round(c, 4) for c in normal_lloyd_max(2)]
    [-1.5104, -0.4528, 0.4528, 1.5104]
    """
    count = 2**bits
    levels = torch.linspace(-2.0, 2.0, count, dtype=torch.float64) * (1 + bits / 4)
    for _ in range(max_iter):
        edges = torch.cat([torch.tensor([-math.inf]), (levels[1:] + levels[:-1]) / 2, torch.tensor([math.inf])])
        mass = torch.special.ndtr(edges).diff()
        density = torch.exp(-(edges**2) / 2) / math.sqrt(2 * math.pi)
        updated = (density[:-1] - density[1:]) / mass
        if (updated - levels).abs().max() < tol:
            return tuple(updated.tolist())
        levels = updated
    raise RuntimeError(f"Lloyd's algorithm for {bits} bits did not converge in {max_iter} iterations.")
