"""Small shared utilities (loaded on first use: the package imports ``fl_lightning.utils._quiet``, which needs no torch)."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {"fl_lightning.utils.seeding": ("derive_seed", "make_generator")})
