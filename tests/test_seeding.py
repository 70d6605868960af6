"""``derive_seed``: stable across processes, distinct per key, non-negative inputs only."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

from fl_lightning.utils import seeding
from fl_lightning.utils.seeding import derive_seed, make_generator

KEYS = [(0, "select", 3), (12345, "client", 7, 2), (1, "select", 0)]


def test_stable_across_processes() -> None:
    """Python salts ``hash(str)`` per process; derive_seed must not depend on it."""
    # Loads the module by path: importing the fl_lightning package (Lightning, wandb...) is slow.
    code = (
        "import importlib.util; "
        f"spec = importlib.util.spec_from_file_location('seeding', {seeding.__file__!r}); "
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); "
        f"print([mod.derive_seed(*k) for k in {KEYS!r}])"
    )
    # A hash salt different from this process's, whatever it is.
    env = {**os.environ, "PYTHONHASHSEED": "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([derive_seed(*k) for k in KEYS])


def test_known_value() -> None:
    # Pinned so that a change of the derivation (which would change every experiment) is deliberate.
    assert derive_seed(0, "select", 3) == derive_seed(0, "select", 3) == 2935472656580762109


def test_range_is_63_bits() -> None:
    for args in itertools.product([0, 1, 2**40], ["a", "client"], range(5)):
        assert 0 <= derive_seed(*args) < 2**63
    torch.Generator().manual_seed(derive_seed(2**62, "x", 2**31))  # accepted by torch


def test_different_keys_differ() -> None:
    args = [
        (seed, purpose, r, c)
        for seed in (0, 1, 7)
        for purpose in ("select", "client", "noise")
        for r in range(4)
        for c in range(4)
    ]
    seeds = [derive_seed(*a) for a in args]
    assert len(set(seeds)) == len(seeds)


def test_key_order_matters() -> None:
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    assert derive_seed(0, "select", 1) != derive_seed(1, "select", 0)


def test_key_tuples_of_different_lengths_differ() -> None:
    # A round-level stream ("noise", r) and client 0's stream ("noise", r, 0) must not coincide.
    assert derive_seed(0, "noise", 3) != derive_seed(0, "noise", 3, 0)


@pytest.mark.parametrize(
    "args", [(-1,), (0, -1), (3, "select", -2), (0, "client", 1, -1)], ids=["seed", "key", "round", "client"]
)
def test_negative_values_are_rejected(args: tuple) -> None:
    with pytest.raises(ValueError, match=r"Seeds and seed keys must be in \[0, 2\*\*64\), got \[.*-\d+.*\]\."):
        derive_seed(*args)


def test_make_generator_uses_derived_seed() -> None:
    a = torch.randint(0, 2**30, (8,), generator=make_generator(5, "select", 2))
    b = torch.randint(0, 2**30, (8,), generator=torch.Generator().manual_seed(derive_seed(5, "select", 2)))
    c = torch.randint(0, 2**30, (8,), generator=make_generator(5, "select", 3))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
