"""TFF's Stack Overflow tag prediction on a tiny SQLite file in TFF's format: the word and tag vocabularies, the
bag-of-words and tag rows against hand-computed ones (both normalisations), lazy reads and a 2-round fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fl_lightning import FederatedTrainer
from fl_lightning.data import TffStackOverflowTags
from fl_lightning.data.client_reader import ClientSamples
from fl_lightning.data.datasets import tff_sqlite
from fl_lightning.data.datasets.multi_hot import MultiHotRows
from fl_lightning.models import TagLogisticRegression

from ...integration.conftest import QUIET
from .tff_files import write_stackoverflow_counts, write_tff_sqlite

pytest.importorskip("google.protobuf", reason="the datasets extra (protobuf) reads TFF's tf.train.Examples")


def post(tokens: str, title: str, tags: str) -> dict[str, list[bytes]]:
    return {"tokens": [tokens.encode()], "title": [title.encode()], "tags": [tags.encode()], "type": [b"question"]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    words = {"the": 90, "a": 80, "is": 70, "python": 60, "never": 1}
    # java and c tie: TFF's stable sort by count keeps the file's order (java first).
    write_stackoverflow_counts(tmp_path, words, {"java": 5, "python": 9, "c": 5, "rare": 1})
    user = [post("the cat is the", "python  a", "python|rare"), post("", "", ""), post("never mind", "", "c|java")]
    write_tff_sqlite(
        tmp_path / "stackoverflow.sqlite",
        {
            "train": {"00042": user, "00007": [post("a", "a", "java")]},
            "heldout": {"00010": [post("is", "", "c")]},
            "test": {"00042": [post("python", "is", "python|java")], "99999": [post("the", "", "")]},
        },
    )
    return tmp_path


def test_vocabularies_are_the_most_frequent_words_and_tags(root: Path) -> None:
    data = TffStackOverflowTags(str(root), vocab_size=4, tag_vocab_size=3)
    assert data.vocab == ["the", "a", "is", "python"] and data.tags == ["python", "java", "c"]
    assert data.client_ids == ["00007", "00042"] and data.client_num_samples(1) == 3
    assert TffStackOverflowTags(str(root), vocab_size=100, tag_vocab_size=100).tags == ["python", "java", "c", "rare"]


@pytest.mark.parametrize(
    ("normalize", "first_post"),
    # "the cat is the python a": 6 words, 5 of the vocabulary (the twice, a, is, python).
    [("vocabulary", [2 / 5, 1 / 5, 1 / 5, 1 / 5]), ("all_words", [2 / 6, 1 / 6, 1 / 6, 1 / 6])],
)
def test_rows_match_hand_computed_bags_and_tags(root: Path, normalize: str, first_post: list[float]) -> None:
    data = TffStackOverflowTags(
        str(root), vocab_size=4, tag_vocab_size=3, normalize=normalize, shuffle=False  # type: ignore[arg-type]
    )
    (x, y), = data.client_batches(1, generator=torch.Generator(), num_epochs=1)
    # The empty post and "never mind" (no vocabulary word) are zero rows; "rare" is not among the 3 tags.
    assert x.dtype == torch.float32 and torch.allclose(x, torch.tensor([first_post, [0.0] * 4, [0.0] * 4]))
    assert y.tolist() == [[1, 0, 0], [0, 0, 0], [0, 1, 1]]
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert x.tolist() == [[0, 1, 0, 0]] and y.tolist() == [[0, 1, 0]]  # "a a": in both normalisations
    (val_x, val_y), = data.val_dataloader()
    assert val_x.tolist() == [[0, 0, 1, 0]] and val_y.tolist() == [[0, 0, 1]]  # the held-out split
    (held_x, held_y), = data.holdout_dataloader(1)
    assert torch.allclose(held_x, torch.tensor([[0, 0, 0.5, 0.5]])) and held_y.tolist() == [[1, 1, 0]]
    assert sum(len(y) for _, y in data.test_dataloader()) == 2


def test_posts_are_read_lazily_and_kept_as_ids(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    original = tff_sqlite.parse_example
    monkeypatch.setattr(tff_sqlite, "parse_example", lambda proto: parsed.append(proto) or original(proto))
    data = TffStackOverflowTags(str(root), vocab_size=4, tag_vocab_size=3)
    assert parsed == []  # the index is client_metadata alone
    samples = ClientSamples(data.train, 1)
    words, tags = samples.tensors
    assert len(parsed) == 3
    # Ids, not dense rows: the client holds its 5 vocabulary words and 3 known tags.
    assert isinstance(words, MultiHotRows) and words._ids.tolist() == [0, 2, 0, 3, 1]
    assert isinstance(tags, MultiHotRows) and tags._ids.tolist() == [0, 2, 1]
    assert samples[2][1].tolist() == [0, 1, 1]  # one post's dense row


def test_tag_logistic_regression_fits_two_rounds(root: Path) -> None:
    model = TagLogisticRegression(num_words=4, num_tags=3, lr=0.5)
    trainer = FederatedTrainer(**QUIET, max_epochs=2, clients_per_round=2, local_epochs=1)
    data = TffStackOverflowTags(str(root), vocab_size=4, tag_vocab_size=3, batch_size=2)
    before = model.net.weight.detach().clone()
    trainer.fit(model, datamodule=data)
    assert trainer.current_epoch == 2 and not torch.equal(model.net.weight, before)
    assert 0 <= trainer.callback_metrics["val_recall_at_5"] <= 1
    assert 0 <= trainer.test(model, datamodule=data, verbose=False)[0]["test_recall_at_5"] <= 1


def test_bad_arguments_and_missing_tag_counts_are_named(root: Path) -> None:
    with pytest.raises(ValueError, match=r"normalize must be one of \['vocabulary', 'all_words'\], got 'sum'"):
        TffStackOverflowTags(str(root), normalize="sum")  # type: ignore[arg-type]
    (root / "stackoverflow.tag_count").unlink()
    with pytest.raises(FileNotFoundError, match="stackoverflow.tag_count.tar.bz2"):
        TffStackOverflowTags(str(root))


def test_tffs_older_hdf5_release_gives_the_same_rows(root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("h5py", reason="the datasets extra (h5py) reads TFF's HDF5 files")
    from .tff_files import write_tff_hdf5

    h5 = tmp_path_factory.mktemp("h5")
    for name in ("stackoverflow.word_count", "stackoverflow.tag_count"):
        (h5 / name).write_bytes((root / name).read_bytes())
    users = {"00042": ["the cat is the|python  a|python|rare", "||", "never mind||c|java"], "00007": ["a|a|java"]}
    for split, by_user in (("train", users), ("held_out", {"00010": ["is||c"]}), ("test", {"00042": ["python|is|python|java"]})):
        features = {u: [p.split("|", 2) for p in ps] for u, ps in by_user.items()}
        write_tff_hdf5(
            h5 / f"stackoverflow_{split}.h5",
            {u: {name: [f[i].encode() for f in fs] for i, name in enumerate(("tokens", "title", "tags"))} for u, fs in features.items()},
        )
    sqlite, hdf5 = (TffStackOverflowTags(str(r), vocab_size=4, tag_vocab_size=3, shuffle=False) for r in (root, h5))
    assert type(hdf5.train).__name__ == "TffHdf5Reader" and hdf5.client_ids == sqlite.client_ids
    for cid in range(2):
        (xa, ya), = hdf5.client_batches(cid, generator=torch.Generator(), num_epochs=1)
        (xb, yb), = sqlite.client_batches(cid, generator=torch.Generator(), num_epochs=1)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
