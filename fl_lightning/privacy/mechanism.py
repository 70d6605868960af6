"""What every DP mechanism shares: the statement of the privacy spent, and its unnoised client statistics kept out
of the logs unless asked for (``docs/privacy_robustness.md``, threat model)."""

from __future__ import annotations

from typing import ClassVar


def privacy_statement(epsilon: float, delta: float, accountant: str, relation: str) -> str:
    """E.g. ``"ε = 3.12 at δ = 1e-05 (RDP, add/remove-one)"``.

    >>> privacy_statement(3.1234, 1e-5, "RDP", "add/remove-one")
    'ε = 3.123 at δ = 1e-05 (RDP, add/remove-one)'
    """
    return f"ε = {epsilon:.4g} at δ = {delta:g} ({accountant}, {relation})"


class DPMechanism:
    """Mixed into an :class:`~fl_lightning.algorithms.shared.wrapper.AlgorithmWrapper` that adds DP noise: it
    states ε at ``delta`` so far (:meth:`epsilon`) by :attr:`accountant_name` under :attr:`neighbouring_relation`,
    and hides the round's unnoised client statistics unless ``log_client_statistics``."""

    differentially_private: ClassVar[bool] = True
    #: The accountant behind :meth:`epsilon`, as the privacy statement names it.
    accountant_name: str = "RDP"
    #: The neighbouring relation the accountant assumes, as the privacy statement names it.
    neighbouring_relation: str
    delta: float
    log_client_statistics: bool

    def epsilon(self) -> float:
        """ε at ``delta`` of what was released so far."""
        raise NotImplementedError

    @property
    def hides_client_statistics(self) -> bool:
        return not self.log_client_statistics

    def privacy_statement(self) -> str:
        """ε at δ so far, the accountant and the neighbouring relation."""
        return privacy_statement(self.epsilon(), self.delta, self.accountant_name, self.neighbouring_relation)
