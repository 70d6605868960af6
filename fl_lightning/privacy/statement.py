"""The line a DP run shows of its budget (progress line, fit summary): ε at δ, the accountant, the neighbouring relation."""

from __future__ import annotations


def privacy_statement(epsilon: float, delta: float, accountant: str, relation: str) -> str:
    """E.g. ``"ε = 3.12 at δ = 1e-05 (RDP, add/remove-one)"``.

    >>> privacy_statement(3.1234, 1e-5, "RDP", "add/remove-one")
    'ε = 3.123 at δ = 1e-05 (RDP, add/remove-one)'
    """
    return f"ε = {epsilon:.4g} at δ = {delta:g} ({accountant}, {relation})"
