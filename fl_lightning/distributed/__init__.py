"""Scale-out: the round's clients sharded over Lightning's DDP processes."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.distributed.sharding": ("ClientSharding", "ShardedRound"),
        "fl_lightning.distributed.strategy": ("FederatedDDPStrategy",),
    },
)
