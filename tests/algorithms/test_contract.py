"""Algorithms reach the run only through ``Federation`` and its services, never into the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import fl_lightning.algorithms as algorithms
from fl_lightning.federation import Federation
from fl_lightning.services import ServerServices

PACKAGE = Path(algorithms.__file__).parent
FORBIDDEN_ATTRIBUTES = {"trainer", "_trainer", "fit_loop"}


def trainer_reaches(tree: ast.AST) -> list[str]:
    """Every import of ``_lightning_compat`` and every ``.trainer``/``.fit_loop`` access in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"line {node.lineno}: imports {n}" for n in names if "_lightning_compat" in n]
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_algorithm_touches_the_trainer(path):
    assert trainer_reaches(ast.parse(path.read_text())) == [], f"{path.name} reaches into the trainer"


@pytest.mark.parametrize(
    "source",
    [
        "from fl_lightning import _lightning_compat as compat",
        "import fl_lightning._lightning_compat",
        "x = module.trainer.optimizers",
        "loop = self.federation.module.trainer.fit_loop",
    ],
)
def test_the_check_catches_each_kind_of_reach(source):
    assert trainer_reaches(ast.parse(source))


class _Data:
    num_clients = 2

    def client_num_samples(self, cid):
        return 3

    def client_batches(self, cid, **kwargs):
        return []


def test_services_outside_a_fit_name_themselves_and_the_metrics_channel_works():
    federation = Federation(data=_Data(), module=torch.nn.Linear(2, 1), clients_per_round=1, seed=0, param_names=frozenset())
    services = federation.services
    assert type(services) is ServerServices
    with pytest.raises(RuntimeError, match="services.optimizer_states.*FederatedTrainer"):
        services.optimizer_states()
    with pytest.raises(RuntimeError, match="accumulate_grad_batches"):
        _ = services.accumulate_grad_batches
    services.report_round_metrics({"a": 1.0})
    services.report_round_metrics({"b": 2.0})
    assert services.pop_round_metrics() == {"a": 1.0, "b": 2.0}
    assert services.pop_round_metrics() == {}


def test_local_weights_share_storage_with_the_module():
    module = torch.nn.Linear(2, 1)
    federation = Federation(data=_Data(), module=module, clients_per_round=1, seed=0, param_names=frozenset())
    federation.load_local_weights({"weight": torch.ones(1, 2), "bias": torch.full((1,), 3.0)})
    assert torch.equal(module.weight.detach(), torch.ones(1, 2)) and module.bias.item() == 3.0
    assert federation.local_weights()["weight"] is module.weight
