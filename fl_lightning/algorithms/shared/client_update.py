"""What passes between the server and one client in a round: the assignment and the update.

Apart from :mod:`~fl_lightning.algorithms.shared.algorithm` so that the server's services can name a
:class:`ClientUpdate` without importing the algorithm contract (which imports the federation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

#: The training metrics every client reports in ``metrics`` when its steps return a loss: the
#: mean task loss, and the mean of any term a mixin added to it (:mod:`fl_lightning.mixins.regularized`).
#: Each round logs their means over its clients as ``round/<key>``.
TRAINING_METRICS = ("train_loss", "train_regularizer")


@dataclass
class ClientContext:
    """One client's assignment in one round.

    ``Algorithm.plan_client`` may change the local work (``num_epochs`` / ``num_steps``, exactly
    one of them set); the loop fills ``completed_steps`` and ``metrics`` after local training.
    """

    round_idx: int
    client_id: int
    num_samples: int
    num_epochs: int | None
    num_steps: int | None
    seed: int
    completed_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What a client sends back to the server.

    Attributes:
        client_id: the client.
        num_samples: its number of training samples (FedAvg's weight).
        num_steps: optimizer steps it completed.
        payload: the tensors sent, by default the delta ``local - global`` of every tensor.
        upload_bytes: exact size of the payload on the wire.
        metrics: client-side metrics (:data:`TRAINING_METRICS` and any the algorithm adds).
        staleness: model versions between the client's dispatch and the aggregation that
            uses its update (set by the asynchronous loop; 0 in synchronous rounds).
    """

    client_id: int
    num_samples: int
    num_steps: int
    payload: dict[str, Tensor]
    upload_bytes: int
    metrics: dict[str, float] = field(default_factory=dict)
    staleness: int = 0
