"""LinearTermMixin: the term's value and its exact gradient, inert until set, and a clear error."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import LinearTermMixin

from .nets import Net, batch


class LinearNet(LinearTermMixin, Net):
    pass


def test_gradient_is_the_task_gradient_plus_the_direction_exactly():
    torch.manual_seed(0)
    net = LinearNet()
    params = dict(net.named_parameters())
    direction = {name: torch.randn_like(p) for name, p in params.items()}
    task = net.training_step(batch(), 0)
    task_grads = torch.autograd.grad(task, list(params.values()))
    net.set_linear_term(direction)
    output = net.training_step(batch(), 0)
    grads = torch.autograd.grad(output["loss"], list(params.values()))
    for name, grad, task_grad in zip(params, grads, task_grads):
        torch.testing.assert_close(grad, task_grad + direction[name], rtol=0, atol=1e-6)
    expected_term = sum((p * direction[name]).sum() for name, p in params.items())
    torch.testing.assert_close(output["regularizer"], expected_term.detach())
    torch.testing.assert_close(output["task_loss"], task.detach())


def test_inert_until_set_and_after_removal():
    torch.manual_seed(0)
    net = LinearNet()
    plain = net.training_step(batch(), 0)
    assert isinstance(plain, torch.Tensor)
    net.set_linear_term({name: torch.ones_like(p) for name, p in net.named_parameters()})
    net.set_linear_term(None)
    assert torch.equal(net.training_step(batch(), 0), plain)


def test_a_direction_naming_no_trainable_parameter_names_it():
    net = LinearNet()
    names = [name for name, _ in net.named_parameters()]
    with pytest.raises(ValueError, match=r"direction names \['head.extra'\], which are not trainable parameters"):
        net.set_linear_term({**{name: torch.zeros(1) for name in names}, "head.extra": torch.zeros(1)})


def test_a_direction_covers_the_shared_parameters_only():
    # A client's local parameters (federated_parameters) have no server direction: they get no term.
    net = LinearNet()
    names = [name for name, _ in net.named_parameters()]
    net.set_linear_term({name: torch.zeros(1) for name in names[:-1]})
    assert len(net._linear_pairs) == len(names) - 1


def test_counts_the_steps_that_added_the_term():
    net = LinearNet()
    net.set_linear_term({name: torch.zeros_like(p) for name, p in net.named_parameters()})
    net.training_step(batch(), 0)
    net.training_step(batch(), 1)
    assert net.applied_term_steps == {LinearTermMixin: 2}
    net.set_linear_term(None)
    assert net.applied_term_steps == {}
