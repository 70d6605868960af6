"""LabelFlip on every batch shape a Lightning project uses (tuples, lists, dicts; sequence labels with a padding
index), Tolpegin et al.'s source-to-target flip, one clear error for what it cannot read (issue 26 item 5); and
malicious_clients' documented rounding (issue 24 item 8)."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.robust import Byzantine, LabelFlip, malicious_clients
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer


def test_every_label_flips_in_tuple_list_and_dict_batches():
    x, y = torch.zeros(4, 2), torch.tensor([0, 3, 9, 5])
    attack = LabelFlip(num_classes=10)
    inputs, labels, meta = attack.poison_batch((x, y, "meta"))
    assert inputs is x and labels.tolist() == [9, 6, 0, 4] and meta == "meta"
    assert isinstance(attack.poison_batch([x, y]), list) and attack.poison_batch([x, y])[1].tolist() == [9, 6, 0, 4]
    flipped = attack.poison_batch({"input_ids": x, "labels": y, "mask": y > 0})
    assert flipped["labels"].tolist() == [9, 6, 0, 4] and flipped["input_ids"] is x
    assert set(flipped) == {"input_ids", "labels", "mask"}


def test_sequence_labels_keep_their_padding_index():
    labels = torch.tensor([[1, 2, -100], [0, -100, -100]])
    flipped = LabelFlip(num_classes=5, label_key="tokens").poison_batch({"tokens": labels})["tokens"]
    assert flipped.tolist() == [[3, 2, -100], [4, -100, -100]]


def test_source_to_target_flips_one_class_only():
    y = torch.tensor([0, 3, 9, 3, 5])
    assert LabelFlip(num_classes=10, source=3, target=8).flip(y).tolist() == [0, 8, 9, 8, 5]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            {"x": torch.zeros(2), "class_id": torch.tensor([1, 2])},
            r"no labels under any of \['label', .*keys \['x', 'class_id'\]: set `label_key`",
        ),
        (torch.zeros(3, 2), "got a Tensor batch"),
        ((torch.zeros(2),), "got a tuple batch"),
        ((torch.zeros(2), torch.tensor([0.5, 1.5])), "integer class labels, got Tensor torch.float32"),
    ],
    ids=["dict-without-labels", "bare-tensor", "one-element-tuple", "float-labels"],
)
def test_a_batch_it_cannot_read_is_one_error_naming_its_type(batch, message):
    with pytest.raises(TypeError, match=message):
        LabelFlip(num_classes=3).poison_batch(batch)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": 1}, "`source` and `target` go together"),
        ({"source": 1, "target": 10}, r"`target` must be a class in 0\.\.9, got 10"),
        ({"source": 2, "target": 2}, "must differ"),
        ({"num_classes": 1}, "`num_classes` must be an integer >= 2"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LabelFlip(**{"num_classes": 10, **kwargs})


@pytest.mark.parametrize(("fraction", "count"), [(0.25, 3), (0.35, 4), (0.15, 2), (0.2, 2), (0.0, 0)])
def test_the_malicious_count_is_fraction_times_n_rounded_half_up(fraction, count):
    assert len(malicious_clients(10, fraction, seed=0)) == count  # 2.5 -> 3 and 3.5 -> 4, not to even


def test_an_unreadable_batch_is_refused_when_the_fit_starts():
    """Byzantine poisons one batch of a malicious client at set-up: the attack's error comes before any client trains."""

    class Unreadable(LabelFlip):
        def poison_batch(self, batch):
            raise TypeError(f"cannot read a {type(batch).__name__} batch")

    trainer = quadratic_trainer(max_epochs=1, algorithm=Byzantine(attack=Unreadable(num_classes=2), fraction=0.5))
    with pytest.raises(TypeError, match="cannot read a tuple batch"):
        trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))
    assert trainer.fit_loop.history == []
