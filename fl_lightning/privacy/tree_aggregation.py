r"""Tree aggregation: noisy prefix sums with logarithmic noise, and their privacy accounting.

The binary-tree mechanism (Dwork et al. 2010; Chan et al. 2011) as DP-FTRL uses it (Kairouz et al. 2021,
"Practical and Private (Deep) Learning without Sampling or Shuffling", §3 and Appendix B): every node of a
binary tree over steps :math:`1..T` holds an independent Gaussian :math:`\mathcal N(0, \sigma^2 I)`, and the
prefix sum :math:`\sum_{\tau \le t} g_\tau` is released with the noise of the :math:`\le \lceil\log_2(t+1)\rceil`
nodes whose intervals partition :math:`[1, t]` (:func:`prefix_nodes`). One record taking part in one step
changes every node above that step, :math:`\lceil\log_2(T+1)\rceil` of them, each by its clipped norm.
"""

from __future__ import annotations

from collections.abc import Sequence

from fl_lightning.privacy.accountant import import_dp_accounting

#: A node of the tree: (level, index); it covers steps ``index * 2**level + 1 .. (index + 1) * 2**level``.
Node = tuple[int, int]


def prefix_nodes(t: int) -> list[Node]:
    """The nodes whose intervals partition steps ``1..t`` (one per 1-bit of ``t``: the binary-counter tree)."""
    if t < 0:
        raise ValueError(f"A step count must be >= 0, got {t}.")
    return [(level, (t >> level) - 1) for level in range(t.bit_length()) if t >> level & 1]


def residual_nodes(t: int) -> tuple[list[Node], list[Node]]:
    """The nodes to add and to subtract to turn step ``t - 1``'s prefix noise into step ``t``'s: the released
    per-step value :math:`s_t - s_{t-1}` then carries exactly the tree's noise, without cancellation error."""
    now, before = prefix_nodes(t), prefix_nodes(t - 1)
    return [n for n in now if n not in before], [n for n in before if n not in now]


def tree_epsilon(noise_multiplier: float, epochs: Sequence[Sequence[int]], delta: float) -> float:
    r"""ε at ``delta`` of tree aggregation with restarts, where each client takes part at most once per epoch.

    ``epochs[e]`` lists the steps of each tree of epoch ``e`` (a tree restarts at every epoch, and wherever a
    run restarted it). Kairouz et al. 2021, Appendix D (Theorem D.1): one epoch of trees is
    :math:`\rho`-zCDP under replace-with-zero neighbours (Definition 1.1) with
    :math:`\rho = \lceil\log_2(T_{\max}+1)\rceil / (2 z^2)`, i.e. RDP :math:`\alpha\rho`; epochs compose. The
    RDP-to-(ε, δ) conversion is dp-accounting's (``SingleEpochTreeAggregationDpEvent``)."""
    if noise_multiplier == 0:
        return float("inf")
    epochs = [list(trees) for trees in epochs if sum(trees) > 0]
    if not epochs:
        return 0.0
    dp = import_dp_accounting()
    accountant = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_SPECIAL)
    accountant.compose(dp.ComposedDpEvent([dp.SingleEpochTreeAggregationDpEvent(noise_multiplier, trees) for trees in epochs]))
    return float(accountant.get_epsilon(delta))
