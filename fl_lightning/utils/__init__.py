"""Small shared utilities."""

from fl_lightning.utils.seeding import derive_seed, make_generator

__all__ = ["derive_seed", "make_generator"]
