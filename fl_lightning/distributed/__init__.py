"""Scale-out: the round's clients sharded over Lightning's DDP processes."""

from fl_lightning.distributed.sharding import ClientSharding, ShardedRound
from fl_lightning.distributed.strategy import FederatedDDPStrategy

__all__ = ["ClientSharding", "FederatedDDPStrategy", "ShardedRound"]
