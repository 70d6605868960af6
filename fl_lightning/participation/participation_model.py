r"""The participation-model contract: how much of its requested local work a client completes.

Ruan et al., "Towards Flexible Device Participation in Federated Learning" (AISTATS 2021),
Section 3.1 and App. A.1.1, model a device's work in round :math:`\tau` as a random number
:math:`s_\tau^k \in \{0, \dots, E\}` of the :math:`E` requested local SGD steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from fl_lightning.participation._participation_checks import check_int, check_requested
from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.seeding import make_generator


class ParticipationModel(RecordsInitArgs, ABC):
    r"""How many of the :math:`E` requested local steps client :math:`k` completes in round :math:`\tau`.

    Ruan et al. (2021, Section 1) distinguish four kinds of flexible participation:

    1. *Incompleteness*, :math:`0 < s_\tau^k < E`: the client submits partial work.
    2. *Inactivity*, :math:`s_\tau^k = 0`: the client does no update or never responds, but
       comes back later. There is no separate "active" flag: **s = 0 means inactive**, and an
       algorithm should skip the client's local training altogether.
    3. *Early departure*: the client leaves for good and says so.
    4. *Late arrival*: a new client joins the objective at round :math:`\tau_0 > 0`.

    A participation model covers the first two: :math:`s_\tau^k` is a random variable on
    :math:`\{0, \dots, E\}` with any per-client (heterogeneous) distribution. Departure and
    arrival change the set of clients in the objective and belong to the client schedule, not
    here (a departed client that stays in the objective is a client with :math:`s = 0` forever).

    Every algorithm uses it the same way::

        model.setup(num_clients=N, seed=seed)            # once
        for round_idx in range(num_rounds):
            for k in selected_clients(round_idx):
                s = model.completed_steps(k, round_idx, requested=E)
                if s == 0:
                    continue                             # inactive: no local training
                train_locally(k, max_steps=s)            # incomplete when s < E

    :meth:`completed_steps` is a pure function of ``(seed, round_idx, client, requested)``:
    subclasses draw from ``make_generator(seed, "participation", round_idx, client)`` (see
    :meth:`_generator`), so the result does not depend on the order in which clients are
    processed, on which process runs them, or on which other clients were asked.

    Subclasses implement :meth:`_completed_steps`; :meth:`completed_steps` validates the
    arguments and the result, so every model raises the same errors for the same mistakes.
    Subclasses with per-client parameters check their length in :meth:`_setup`.
    """

    _num_clients: int | None = None
    _seed: int = 0

    def setup(self, *, num_clients: int, seed: int) -> None:
        """Binds the model to the federation; called once by the algorithm before the first round.

        Raises:
            ValueError: If ``num_clients < 1``, ``seed < 0``, or a per-client parameter does not
                have exactly ``num_clients`` entries.
        """
        # A failed (re-)setup leaves the model unusable rather than half-configured.
        self._num_clients = None
        num_clients = check_int("num_clients", num_clients, minimum=1)
        self._seed = check_int("seed", seed, minimum=0)
        self._setup(num_clients)
        self._num_clients = num_clients

    def _setup(self, num_clients: int) -> None:
        """Resolves per-client parameters; raises ``ValueError`` on a length mismatch."""

    @property
    def num_clients(self) -> int:
        """The number of clients given to :meth:`setup`."""
        if self._num_clients is None:
            raise RuntimeError(f"{type(self).__name__}.setup(num_clients=..., seed=...) must be called first.")
        return self._num_clients

    def completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        """The number of local steps ``s`` in ``{0, ..., requested}`` that ``client`` completes.

        Args:
            client: Client index in ``[0, num_clients)``.
            round_idx: Round index, ``>= 0``.
            requested: The requested number of local steps :math:`E`, ``>= 1``.

        Raises:
            ValueError: On a client outside ``[0, num_clients)``, a negative round or ``E < 1``.
            RuntimeError: If :meth:`setup` has not been called.
        """
        requested = check_requested(requested)
        client = self._check_client(client)
        round_idx = check_int("round_idx", round_idx, minimum=0)
        steps = self._completed_steps(client, round_idx, requested)
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= requested:
            raise RuntimeError(
                f"{type(self).__name__} returned {steps!r} steps for client {client} in round {round_idx}; "
                f"expected an int in [0, {requested}]."
            )
        return int(steps)

    def _check_client(self, client: object) -> int:
        """Validates a client index against :meth:`setup`'s ``num_clients``."""
        num_clients = self.num_clients
        client = check_int("client", client, minimum=0)
        if client >= num_clients:
            raise ValueError(f"`client` must be in [0, {num_clients}), got {client}.")
        return client

    @abstractmethod
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        """Returns ``s`` in ``{0, ..., requested}``; the arguments are already validated."""

    def _generator(self, *keys: int | str) -> torch.Generator:
        """``make_generator(seed, *keys)`` with the seed given to :meth:`setup`."""
        return make_generator(self._seed, *keys)

    def _uniform(self, *keys: int | str) -> float:
        """One float64 draw from U[0, 1) on the stream ``(seed, *keys)``."""
        return torch.rand((), generator=self._generator(*keys), dtype=torch.float64).item()

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint; empty because every draw is recomputed from the seed."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`."""

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in vars(self).items() if not key.startswith("_"))
        return f"{type(self).__name__}({args})"
