"""Numeric argument checks shared by every constructor: one ``ValueError`` line naming the argument, the value
and what is allowed.

A plain ``if lr <= 0`` lets ``nan`` through (every comparison with NaN is false) and ``inf`` too; these
checks refuse both unless the range says otherwise.

    >>> check_real("lr", 0.1, low=0, low_open=True)
    0.1
    >>> check_real("lr", float("nan"), low=0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: `lr` must be a finite number > 0, got nan.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


def _inside(value: float, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or (value < high if high_open else value <= high)
    return above and below


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Returns ``value`` as a ``float`` if it is a finite real number in the interval, else raises ``ValueError``
    naming ``name``, the value and the interval (``low_open``/``high_open``: the bound itself is excluded)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if real and math.isfinite(value) and _inside(float(value), low, high, low_open, high_open):  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]
    allowed = " ".join(filter(None, ["a finite number", _interval(low, high, low_open, high_open)]))
    raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")


def check_integer(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Returns ``value`` as an ``int`` if it is an integer (not a bool, not a float) in ``[minimum, maximum]``,
    else raises ``ValueError`` naming ``name``, the value and the range."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if integral and minimum <= value and (maximum is None or value <= maximum):  # type: ignore[operator]
        return int(value)  # type: ignore[arg-type]
    allowed = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
    raise ValueError(f"`{name}` must be an integer {allowed}, got {value!r}.")


def positive(name: str, value: object) -> float:
    """``value`` as a finite ``float > 0``, or a ``ValueError`` naming it."""
    return check_real(name, value, low=0, low_open=True)


def non_negative(name: str, value: object) -> float:
    """``value`` as a finite ``float >= 0``, or a ``ValueError`` naming it."""
    return check_real(name, value, low=0)


def optional(check: Callable[..., T], name: str, value: object, **bounds: Any) -> T | None:
    """``None``, or ``check(name, value, **bounds)``."""
    return None if value is None else check(name, value, **bounds)


def check_sizes(**sizes: object) -> None:
    """Raises ``ValueError`` naming the first of ``sizes`` (layer widths, counts of channels, features or words)
    that is not an integer >= 1."""
    for name, value in sizes.items():
        check_integer(name, value, minimum=1)
