"""What the module's optimizers and LR schedulers must satisfy before the first client trains.

Checked when the fit starts, so that a configuration no round could train with ends with one ``ValueError``
naming the optimizer or scheduler rather than a silent run (an optimizer over copies of the parameters never
moves the module's weights, which are the ones loaded, sent and aggregated) or a ``ZeroDivisionError`` mid-round.
"""

from __future__ import annotations

import inspect

import lightning.pytorch as pl
import torch

from fl_lightning.utils.checks import check_integer


def check_optimizers(trainer: pl.Trainer) -> None:
    """Raises ``ValueError`` for an optimizer that holds a tensor that is not one of the module's parameters,
    or an LR scheduler whose ``frequency`` is not an integer >= 1."""
    module = trainer.lightning_module
    owned = {id(p) for p in module.parameters()}
    for index, optimizer in enumerate(trainer.optimizers):
        foreign = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in owned]
        if foreign:
            held = sum(len(group["params"]) for group in optimizer.param_groups)
            raise ValueError(
                f"Optimizer {index} ({type(optimizer).__name__}) of {type(module).__name__}.configure_optimizers holds "
                f"{len(foreign)} of its {held} tensors that are not the module's parameters (a copy?), so stepping it "
                "never changes the weights that are trained, sent and aggregated: build it over self.parameters()."
            )
    for config in trainer.lr_scheduler_configs:
        check_integer(f"frequency of the {type(config.scheduler).__name__} LR scheduler", config.frequency, minimum=1)


def closure_optimizers(trainer: pl.Trainer) -> list[str]:
    """The names of the trainer's optimizers whose ``step`` requires a closure (``LBFGS``), which only
    Lightning's loop provides."""
    return [type(o).__name__ for o in trainer.optimizers if _needs_closure(o)]


def _needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin step without a signature
        return False
    return closure is not None and closure.default is inspect.Parameter.empty
