"""TFF's SQLite files, written here in TFF's schema with hand-encoded tf.train.Examples: parsing, client ids,
per-client counts, the splits, lazy reads, TFF's baseline preprocessing and the missing-file error."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning import FederatedTrainer
from fl_lightning.data import TffCIFAR100, TffEMNIST, TffShakespeare, TffStackOverflow
from fl_lightning.data.datasets import tff_sqlite
from fl_lightning.data.datasets.tff import TFF_SHAKESPEARE_CHARS
from fl_lightning.models import MLP

from ...integration.conftest import QUIET
from .tff_files import write_tff_hdf5, write_tff_sqlite

pytest.importorskip("google.protobuf", reason="the datasets extra (protobuf) reads TFF's tf.train.Examples")


def emnist_examples(seed: int, n: int, classes: int = 62) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"label": [int(rng.integers(classes))], "pixels": rng.random(784, dtype=np.float32)} for _ in range(n)]


@pytest.fixture
def emnist_root(tmp_path: Path) -> Path:
    writers = ["f3_12", "f0_40", "f1_07"]
    write_tff_sqlite(
        tmp_path / "emnist_all.sqlite",
        {
            "all_train": {w: emnist_examples(i, 3 + i) for i, w in enumerate(writers)},
            "all_test": {w: emnist_examples(10 + i, 2) for i, w in enumerate(writers)},
            "digits_only_train": {"f0_40": emnist_examples(20, 2, 10)},
            "digits_only_test": {"f0_40": emnist_examples(21, 1, 10)},
        },
    )
    return tmp_path


def test_emnist_clients_counts_samples_and_splits(emnist_root: Path) -> None:
    data = TffEMNIST(str(emnist_root), shuffle=False)
    assert data.client_ids == ["f0_40", "f1_07", "f3_12"] and data.num_classes == 62
    assert [data.client_num_samples(c) for c in range(3)] == [4, 5, 3]
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    expected = emnist_examples(1, 4)  # f0_40 was written second
    assert x.shape == (4, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(x.reshape(4, -1), torch.from_numpy(np.stack([e["pixels"] for e in expected])))
    assert y.tolist() == [e["label"][0] for e in expected]
    (held_x, _), = data.holdout_dataloader(2)
    assert torch.equal(held_x.reshape(2, -1), torch.from_numpy(np.stack([e["pixels"] for e in emnist_examples(10, 2)])))
    digits = TffEMNIST(str(emnist_root), only_digits=True)
    assert digits.client_ids == ["f0_40"] and digits.num_classes == 10 and digits.client_num_samples(0) == 2


def test_only_the_training_client_is_parsed(emnist_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    original = tff_sqlite.parse_example
    monkeypatch.setattr(tff_sqlite, "parse_example", lambda proto: parsed.append(proto) or original(proto))
    data = TffEMNIST(str(emnist_root))
    assert parsed == []  # the index is client_metadata alone
    data.client_batches(1, generator=torch.Generator(), num_epochs=1)
    assert len(parsed) == 5
    reader = pickle.loads(pickle.dumps(data.train))  # as a spawned DataLoader worker gets it
    assert len(reader.read(0)[1]) == 4


def test_evaluation_loaders_read_in_worker_processes(emnist_root: Path) -> None:
    data = TffEMNIST(str(emnist_root), num_workers=2)
    data.train.read(0)  # the parent's connection is open before the workers fork
    assert sum(len(y) for _, y in data.test_dataloader()) == 6


def test_emnist_trains_and_tests(emnist_root: Path) -> None:
    model = MLP(in_features=784, hidden=(8,), num_classes=62, lr=0.1)
    trainer = FederatedTrainer(**QUIET, max_epochs=2, clients_per_round=2, local_steps=1)
    trainer.fit(model, datamodule=TffEMNIST(str(emnist_root), val_fraction=0.3))
    assert 0 <= trainer.test(model, datamodule=TffEMNIST(str(emnist_root)), verbose=False)[0]["test_acc"] <= 1


def test_missing_or_wrong_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        TffEMNIST(str(tmp_path))
    message = str(error.value)
    assert "TffEMNIST" in message and "tff-datasets-public/emnist_all.sqlite.lzma" in message and "unxz" in message
    assert repr(str(tmp_path)) in message
    write_tff_sqlite(tmp_path / "emnist_all.sqlite", {"train": {"a": emnist_examples(0, 1)}})
    with pytest.raises(ValueError, match=r"has no clients in split 'all_train'; its splits are \['train'\]"):
        TffEMNIST(str(tmp_path))


def test_shakespeare_follows_tff_char_preprocessing(tmp_path: Path) -> None:
    snippets = {"HAMLET": [b"ab", "To be, or not ~ to bé".encode()], "OPHELIA": [b""]}
    write_tff_sqlite(
        tmp_path / "shakespeare.sqlite",
        {"train": {k: [{"snippets": [s]} for s in v] for k, v in snippets.items()}, "test": {"HAMLET": [{"snippets": [b"x"]}]}},
    )
    data = TffShakespeare(str(tmp_path), sequence_length=3, shuffle=False)
    token = {c: i + 1 for i, c in enumerate(TFF_SHAKESPEARE_CHARS)}
    oov, bos, eos = 87, 88, 89
    # "ab": [bos, a, b, eos] is one chunk of 4; an empty snippet is [bos, eos, pad, pad].
    reference = [[bos, token["a"], token["b"], eos]]
    long = [bos, *(token.get(chr(b), oov) for b in "To be, or not ~ to bé".encode()), eos]
    long += [0] * (-len(long) % 4)
    reference += [long[i : i + 4] for i in range(0, len(long), 4)]
    assert data.client_num_samples(0) == len(reference) == 7 and data.client_num_samples(1) == 1
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1, batch_size=100)
    assert x.tolist() == [r[:-1] for r in reference] and y.tolist() == [r[1:] for r in reference]
    assert oov in x.flatten().tolist()  # "~" and both bytes of "é" are out of vocabulary
    (x, y), = data.client_batches(1, generator=torch.Generator(), num_epochs=1)
    assert x.tolist() == [[bos, eos, 0]] and y.tolist() == [[eos, 0, 0]]
    assert data.num_classes == 90


def test_stackoverflow_follows_tff_word_preprocessing_with_heldout_validation(tmp_path: Path) -> None:
    (tmp_path / "stackoverflow.word_count").write_text("the 90\na 80\nis 70\nnever 1\n")
    posts = {"00042": ["the cat is", "a a a a a a", ""], "00007": ["is"]}
    write_tff_sqlite(
        tmp_path / "stackoverflow.sqlite",
        {
            "train": {u: [{"tokens": [p.encode()], "title": [b"t"], "tags": [b"x|y"]} for p in ps] for u, ps in posts.items()},
            "heldout": {"00010": [{"tokens": [b"the the"]}]},
            "test": {"00042": [{"tokens": [b"a"]}], "99999": [{"tokens": [b"is a"]}]},
        },
    )
    data = TffStackOverflow(str(tmp_path), vocab_size=3, sequence_length=4, shuffle=False)
    assert data.vocab == ["the", "a", "is"] and data.num_classes == 7
    assert data.client_ids == ["00007", "00042"] and data.client_num_samples(1) == 3
    # the=1 a=2 is=3, OOV 4, BOS 5, EOS 6 (appended only below sequence_length), pad 0.
    (x, y), = data.client_batches(1, generator=torch.Generator(), num_epochs=1)
    assert x.tolist() == [[5, 1, 4, 3], [5, 2, 2, 2], [5, 4, 6, 0]]
    assert y.tolist() == [[1, 4, 3, 6], [2, 2, 2, 2], [4, 6, 0, 0]]
    (val_x, _), = data.val_dataloader()
    assert val_x.tolist() == [[5, 1, 1, 6]]  # the held-out split, never the test split
    assert sum(len(y) for _, y in data.test_dataloader()) == 2
    (held_x, _), = data.holdout_dataloader(1)
    assert held_x.tolist() == [[5, 2, 6, 0]]  # user 00042's own posts of the test period
    assert list(data.holdout_dataloader(0)) == []
    with pytest.raises(ValueError, match="either val"):
        TffStackOverflow(str(tmp_path), vocab_size=3, val_fraction=0.1)
    (tmp_path / "stackoverflow.word_count").unlink()
    with pytest.raises(FileNotFoundError, match="stackoverflow.word_count.tar.bz2"):
        TffStackOverflow(str(tmp_path))


def test_cifar100_images_labels_and_separate_test_clients(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 32, 32, 3))
    examples = [{"coarse_label": [i], "image": images[i].reshape(-1), "label": [50 + i]} for i in range(3)]
    write_tff_sqlite(tmp_path / "cifar100.sqlite", {"train": {"0": examples[:2], "1": examples[2:]}, "test": {"0": examples[:1]}})
    data = TffCIFAR100(str(tmp_path), shuffle=False)
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert torch.equal(x, torch.from_numpy(images[:2]).permute(0, 3, 1, 2).float() / 255) and y.tolist() == [50, 51]
    (_, coarse), = TffCIFAR100(str(tmp_path), label="coarse", shuffle=False).client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert coarse.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="test clients that are not its training clients"):
        data.holdout_dataloader(0)
    with pytest.raises(ValueError, match=r"label must be one of \['fine', 'coarse'\], got 'medium'"):
        TffCIFAR100(str(tmp_path), label="medium")  # type: ignore[arg-type]


def tf_per_image_standardization(image: np.ndarray) -> np.ndarray:
    """The published formula of ``tf.image.per_image_standardization``: ``(x - mean) / max(stddev, 1/sqrt(N))``
    over all ``N`` values of one image, in float64."""
    values = image.astype(np.float64)
    return (values - values.mean()) / max(values.std(), 1 / np.sqrt(values.size))


def test_cifar100_reference_pipeline_crops_then_standardises_each_image(tmp_path: Path) -> None:
    """TffCIFAR100 into ResNet18GN.preprocess, against TFF's build_image_map computed from the published formulas:
    cast the uint8 image to float, crop (central 24x24 in evaluation: resize_with_crop_or_pad; a random 24x24
    window, maybe mirrored, in training), then per_image_standardization."""
    from fl_lightning.models import ResNet18GN

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 32, 32, 3))
    images[1] = 100  # a flat image: all zeros
    images[2] = 100
    images[2, 14, 14, 0] = 101  # one value off: stddev sqrt(1727)/1728 < 1/sqrt(1728), the floor divides
    images[3] = rng.integers(120, 123, (32, 32, 3))  # low contrast
    examples = [{"coarse_label": [0], "image": image.reshape(-1), "label": [i]} for i, image in enumerate(images)]
    write_tff_sqlite(tmp_path / "cifar100.sqlite", {"train": {"0": examples}, "test": {"0": examples}})
    (x, _), = TffCIFAR100(str(tmp_path), shuffle=False).client_batches(0, generator=torch.Generator(), num_epochs=1)
    model = ResNet18GN()
    expected = np.stack([tf_per_image_standardization(image[4:28, 4:28]) for image in images])  # HWC, as TF
    got = model.eval().preprocess(x).permute(0, 2, 3, 1).double().numpy()
    assert np.abs(got - expected).max() < 1e-5
    assert np.all(got[1] == 0) and got[2].max() == pytest.approx((1 - 1 / 1728) * np.sqrt(1728), rel=1e-5)
    torch.manual_seed(0)
    trained = model.train().preprocess(x).permute(0, 2, 3, 1).double().numpy()
    for crop, image in zip(trained, images):
        windows = [image[top : top + 24, left : left + 24, :] for top in range(9) for left in range(9)]
        candidates = [tf_per_image_standardization(w) for w in windows + [w[:, ::-1] for w in windows]]
        assert min(np.abs(crop - c).max() for c in candidates) < 1e-5
    assert np.allclose(trained.reshape(4, -1)[[0, 3]].mean(1), 0, atol=1e-5)


def test_tffs_older_hdf5_release_loads_as_its_sqlite(tmp_path: Path, emnist_root: Path) -> None:
    """The same clients written in both of TFF's formats: the same ids, counts and batches."""
    pytest.importorskip("h5py", reason="the datasets extra (h5py) reads TFF's HDF5 files")
    h5 = tmp_path / "h5"
    h5.mkdir()
    def stacked(examples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        pixels = np.stack([e["pixels"] for e in examples]).reshape(-1, 28, 28)
        return {"label": np.array([e["label"][0] for e in examples], dtype=np.int32), "pixels": pixels}

    writers = ["f3_12", "f0_40", "f1_07"]
    write_tff_hdf5(h5 / "fed_emnist_train.h5", {w: stacked(emnist_examples(i, 3 + i)) for i, w in enumerate(writers)})
    write_tff_hdf5(h5 / "fed_emnist_test.h5", {w: stacked(emnist_examples(10 + i, 2)) for i, w in enumerate(writers)})
    sqlite, hdf5 = TffEMNIST(str(emnist_root)), TffEMNIST(str(h5))
    assert type(hdf5.train).__name__ == "TffHdf5Reader" and hdf5.client_ids == sqlite.client_ids
    for cid in range(3):
        assert hdf5.client_num_samples(cid) == sqlite.client_num_samples(cid)
        for (xa, ya), (xb, yb) in zip(
            hdf5.client_batches(cid, generator=torch.Generator().manual_seed(cid), num_epochs=2),
            sqlite.client_batches(cid, generator=torch.Generator().manual_seed(cid), num_epochs=2),
        ):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    (x, _), = hdf5.holdout_dataloader(0)
    (reference, _), = sqlite.holdout_dataloader(0)
    assert torch.equal(x, reference)


def test_tff_shakespeare_hdf5_counts_chunks_as_sqlite(tmp_path: Path) -> None:
    pytest.importorskip("h5py", reason="the datasets extra (h5py) reads TFF's HDF5 files")
    roles = {"HAMLET": [{"snippets": [b"To be, or not"]}, {"snippets": [b"ab"]}], "KENT": [{"snippets": [b"x"]}]}
    (tmp_path / "h5").mkdir()
    for split in ("train", "test"):
        write_tff_hdf5(tmp_path / "h5" / f"shakespeare_{split}.h5", {r: {"snippets": [e["snippets"][0] for e in es]} for r, es in roles.items()})
    write_tff_sqlite(tmp_path / "shakespeare.sqlite", {"train": roles, "test": roles})
    hdf5 = TffShakespeare(str(tmp_path / "h5"), sequence_length=5, shuffle=False)
    sqlite = TffShakespeare(str(tmp_path), sequence_length=5, shuffle=False)
    assert [hdf5.client_num_samples(c) for c in range(2)] == [sqlite.client_num_samples(c) for c in range(2)] == [4, 1]
    (xa, ya), = hdf5.client_batches(0, generator=torch.Generator(), num_epochs=1)
    (xb, yb), = sqlite.client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_sqlite_without_the_client_index_gets_it_once_or_a_warning_with_the_command(tmp_path: Path) -> None:
    """TFF's writer creates no (split_name, client_id) index: without it each client read scans the table."""
    import sqlite3
    import warnings

    def unindexed(path: Path) -> None:
        write_tff_sqlite(path, {"all_train": {c: emnist_examples(i, 3) for i, c in enumerate("abc")}, "all_test": {"a": emnist_examples(9, 1)}})
        with sqlite3.connect(path) as db:
            db.executescript("DROP INDEX idx_examples_client_id; DROP INDEX idx_examples_client_id_split;")
        db.close()

    def plan(path: Path) -> str:
        with sqlite3.connect(path) as db:
            rows = db.execute(
                "EXPLAIN QUERY PLAN SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ?", ("all_train", "a")
            ).fetchall()
        db.close()
        return " ".join(row[-1] for row in rows)

    unindexed(tmp_path / "emnist_all.sqlite")
    assert "SCAN" in plan(tmp_path / "emnist_all.sqlite")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # creating it is silent
        data = TffEMNIST(str(tmp_path))
    assert "USING INDEX" in plan(tmp_path / "emnist_all.sqlite") and data.train.indexed and data.train.index_seconds is not None
    assert data.test.indexed and data.test.index_seconds is None  # found, not created again
    (x, _), = data.client_batches(1, generator=torch.Generator(), num_epochs=1)
    assert len(x) == 3

    read_only = tmp_path / "ro"
    read_only.mkdir()
    unindexed(read_only / "emnist_all.sqlite")
    with pytest.warns(UserWarning, match=r"has no index on examples\(split_name, client_id\).*create_index=False.*CREATE INDEX") as record:
        reader = tff_sqlite.TffSqliteReader(read_only / "emnist_all.sqlite", "all_train", lambda e: (torch.zeros(len(e)),), dataset="x", create_index=False)
        tff_sqlite.TffSqliteReader(read_only / "emnist_all.sqlite", "all_test", lambda e: (torch.zeros(len(e)),), dataset="x", create_index=False)
    assert len(record) == 1 and not reader.indexed and "SCAN" in plan(read_only / "emnist_all.sqlite")
    assert len(reader.read(0)[0]) == 3  # still reads, by scanning
