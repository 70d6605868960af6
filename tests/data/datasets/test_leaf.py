"""LEAF's JSON files, written here exactly as LEAF's preprocessing writes them: parsing, client ids,
per-client counts, the train/test split, lazy reads, and the missing-file error."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning import FederatedTrainer
from fl_lightning.data import LeafCelebA, LeafFEMNIST, LeafSent140, LeafShakespeare
from fl_lightning.data.datasets.leaf import SHAKESPEARE_LETTERS
from fl_lightning.data.datasets.leaf_json import index_leaf_file

from ...integration.conftest import QUIET


def write_leaf(root: Path, split: str, files: list[dict[str, dict[str, list[Any]]]], *, indent: int | None = None) -> None:
    """Writes ``<root>/data/<split>/part_<i>.json``, one per ``{user: {"x": [...], "y": [...]}}``, as LEAF's
    ``split_data.py`` does (``json.dump`` of ``users``, ``num_samples``, ``user_data``)."""
    folder = root / "data" / split
    folder.mkdir(parents=True, exist_ok=True)
    for number, users in enumerate(files):
        record = {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}
        with open(folder / f"part_{number}.json", "w") as file:
            json.dump(record, file, indent=indent)


def split_like_leaf(root: Path, name: str, all_data: dict[str, dict[str, list[Any]]], *, frac: float = 0.9, seed: int = 1) -> None:
    """LEAF's ``data/utils/split_data.py --by_sample`` (https://github.com/TalwalkarLab/leaf), transcribed: writes
    ``<root>/data/{train,test}/all_data_{train,test}_<frac>.json`` from ``all_data`` (``{user: {"x", "y"}}``).

    Shakespeare's training windows are a user's first ``num_train`` and its test windows start at
    ``num_train + 80 - 1`` (so none overlaps a training window), while ``num_samples`` of the test file
    is ``n - num_train``: 79 more than the test file holds. Other datasets draw the training samples at random.
    """
    rng = random.Random(seed)
    label = str(frac)[2:]
    train: dict[str, Any] = {"users": [], "num_samples": [], "user_data": {}}
    test: dict[str, Any] = {"users": [], "num_samples": [], "user_data": {}}
    for user, data in all_data.items():
        n = len(data["y"])
        if n < 2:
            continue
        num_train = 1 if n == 2 else max(1, int(frac * n))
        if name == "shakespeare":
            train_indices, test_indices = list(range(num_train)), list(range(num_train + 80 - 1, n))
        else:
            train_indices = rng.sample(range(n), num_train)
            test_indices = [i for i in range(n) if i not in train_indices]
        if not train_indices or not test_indices:
            continue
        for split, indices, count in ((train, set(train_indices), num_train), (test, set(test_indices), n - num_train)):
            split["users"].append(user)
            split["num_samples"].append(count)
            split["user_data"][user] = {key: [data[key][i] for i in range(n) if i in indices] for key in ("x", "y")}
    for split_name, split in (("train", train), ("test", test)):
        (root / "data" / split_name).mkdir(parents=True, exist_ok=True)
        with open(root / "data" / split_name / f"all_data_{split_name}_{label}.json", "w") as file:
            json.dump(split, file)


def shakespeare_all_data(roles: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """LEAF's ``all_data`` of Shakespeare (``preprocess/gen_all_data.py``): every 80-character window of a
    role's text, ``y`` the character after it."""
    return {
        role: {"x": [text[i : i + 80] for i in range(len(text) - 80)], "y": [text[i + 80] for i in range(len(text) - 80)]}
        for role, text in roles.items()
    }


def femnist_user(seed: int, n: int) -> dict[str, list[Any]]:
    rng = np.random.default_rng(seed)
    return {"x": rng.random((n, 784)).round(4).tolist(), "y": rng.integers(0, 62, n).tolist()}


@pytest.fixture
def femnist_root(tmp_path: Path) -> Path:
    users = {f"f{i:04d}_{i % 3}": femnist_user(i, 3 + i) for i in range(5)}
    ids = list(users)
    # Two files, users not in sorted order within or across them.
    write_leaf(tmp_path, "train", [{ids[3]: users[ids[3]], ids[0]: users[ids[0]]}, {k: users[k] for k in (ids[4], ids[1], ids[2])}])
    write_leaf(tmp_path, "test", [{k: femnist_user(100 + i, 2) for i, k in enumerate(ids)}], indent=2)
    return tmp_path


def test_femnist_clients_counts_samples_and_split(femnist_root: Path) -> None:
    data = LeafFEMNIST(str(femnist_root), batch_size=100)
    assert data.client_ids == [f"f{i:04d}_{i % 3}" for i in range(5)]  # sorted across files
    assert [data.client_num_samples(c) for c in range(5)] == [3, 4, 5, 6, 7]
    expected = femnist_user(3, 6)
    (x, y), = data.client_batches(3, generator=torch.Generator(), num_epochs=1)
    reference = torch.tensor(expected["x"], dtype=torch.float32).reshape(-1, 1, 28, 28)
    assert x.shape == (6, 1, 28, 28) and y.dtype == torch.int64
    assert sorted(map(tuple, x.reshape(6, -1).tolist())) == sorted(map(tuple, reference.reshape(6, -1).tolist()))
    assert sorted(y.tolist()) == sorted(expected["y"])
    (held_x, held_y), = data.holdout_dataloader(3)  # the client's own LEAF test samples, in file order
    assert torch.equal(held_x, torch.tensor(femnist_user(103, 2)["x"], dtype=torch.float32).reshape(-1, 1, 28, 28))
    assert sum(len(y) for _, y in data.test_dataloader()) == 10


def test_only_the_training_client_is_decoded(femnist_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    original = LeafFEMNIST.decode

    def counting(self: LeafFEMNIST, x: list[Any], y: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        decoded.append(len(y))
        return original(self, x, y)

    monkeypatch.setattr(LeafFEMNIST, "decode", counting)
    data = LeafFEMNIST(str(femnist_root))
    assert decoded == []
    data.client_batches(4, generator=torch.Generator(), num_epochs=1)
    assert decoded == [7]


@pytest.mark.parametrize("numbers_first", [False, True])
def test_index_spans_decode_to_each_users_record(tmp_path: Path, numbers_first: bool) -> None:
    """Brackets and escaped quotes inside strings, spaces, top-level keys in another order; the first user's
    samples (numbers or strings) choose how the others are scanned, so both orders are checked."""
    users = {"b": {"x": [["}", "a\\\"]{"]], "y": [0]}, "a é": {"x": [[3, 4.5], [5, 6]], "y": [1, "é]"]}}
    values = {
        "b": '{"x": [["}", "a\\\\\\"]{"]], "y": [0]}',
        "a é": '{"x":[[3,4.5],[5,6]],"y":[1,"é]"]}',
    }
    order = ["a é", "b"] if numbers_first else ["b", "a é"]
    body = " ,\n".join(f'{json.dumps(u)}: {values[u]}' for u in order)
    path = tmp_path / "f.json"
    # num_samples overstates both users (as LEAF's Shakespeare test split does): the counts are len(y).
    path.write_text(f'{{ "num_samples" : [80, 81],\n "user_data": {{{body}}}, "users": ["b", "a é"] }}', encoding="utf-8")
    ids, counts, spans = index_leaf_file(path)
    assert ids == ["b", "a é"] and counts.tolist() == [1, 2]
    raw = path.read_bytes()
    assert {user: json.loads(raw[start:end]) for user, (start, end) in zip(ids, spans.tolist())} == users


def test_a_broken_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "x.json").write_text('{"users": ["a"], "num_samples": [1], "user_data": {"b": {}}}')
    with pytest.raises(ValueError, match=r"x.json': 'users' and 'user_data' disagree \(e.g. user 'a'\)"):
        LeafFEMNIST(str(tmp_path))
    (tmp_path / "data" / "train" / "x.json").write_text('{"users": ["a"], "num_samples": [1], "user_data": {"a": ')
    with pytest.raises(ValueError, match="x.json' is not a LEAF JSON file"):
        LeafFEMNIST(str(tmp_path))


def test_shakespeare_split_by_leafs_split_data_is_read_as_leaf_reads_it(tmp_path: Path) -> None:
    """LEAF's own split writes each test user's num_samples 79 above len(y); the reader counts len(y), as LEAF's
    client code does, and every test window is read."""
    rng = np.random.default_rng(0)
    sizes = {"HAMLET": 1000, "OPHELIA": 120, "LAERTES": 900}  # windows; OPHELIA's test part is empty: LEAF drops her
    all_data = shakespeare_all_data({role: "".join(rng.choice(list(SHAKESPEARE_LETTERS), 80 + n)) for role, n in sizes.items()})
    split_like_leaf(tmp_path, "shakespeare", all_data)
    test_file = json.loads((tmp_path / "data" / "test" / "all_data_test_9.json").read_text())
    assert test_file["users"] == ["HAMLET", "LAERTES"]
    assert test_file["num_samples"] == [100, 90] and [len(test_file["user_data"][u]["y"]) for u in ("HAMLET", "LAERTES")] == [21, 11]
    data = LeafShakespeare(str(tmp_path), shuffle=False)
    assert data.client_ids == ["HAMLET", "LAERTES"]
    assert [data.client_num_samples(c) for c in range(2)] == [900, 810]  # int(0.9 n) training windows
    (x, y), = data.holdout_dataloader(0)  # HAMLET's test windows: 979 to 999
    assert len(y) == 21 and "".join(SHAKESPEARE_LETTERS[i] for i in x[0]) == all_data["HAMLET"]["x"][900 + 79]
    assert sum(len(y) for _, y in data.test_dataloader()) == 32


def test_x_and_y_of_different_lengths_are_named_as_the_cause(tmp_path: Path) -> None:
    write_leaf(tmp_path, "train", [{"u": {"x": femnist_user(0, 3)["x"], "y": [1, 2]}}])
    write_leaf(tmp_path, "test", [{"u": femnist_user(1, 1)}])
    data = LeafFEMNIST(str(tmp_path))
    assert data.client_num_samples(0) == 2  # len(y)
    with pytest.raises(ValueError, match=r"part_0.json': user 'u' has 3 samples in 'x' but 2 labels in 'y'"):
        data.client_batches(0, generator=torch.Generator(), num_epochs=1)


def test_missing_files_say_where_to_get_them_and_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        LeafFEMNIST(str(tmp_path / "femnist"))
    message = str(error.value)
    assert "LeafFEMNIST" in message and "never downloads" in message
    assert "github.com/TalwalkarLab/leaf" in message and "preprocess.sh -s niid" in message
    assert str(tmp_path / "femnist" / "data" / "train") in message


def test_shakespeare_windows_and_next_characters(tmp_path: Path) -> None:
    text = "To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer [x]"
    windows = [text[i : i + 80] for i in range(3)]
    write_leaf(tmp_path, "train", [{"HAMLET": {"x": windows, "y": [text[80 + i] for i in range(3)]}}])
    write_leaf(tmp_path, "test", [{"HAMLET": {"x": windows[:1], "y": [text[80]]}}])
    data = LeafShakespeare(str(tmp_path), shuffle=False)
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert x.shape == (3, 80) and len(SHAKESPEARE_LETTERS) == 80 == data.num_classes
    assert "".join(SHAKESPEARE_LETTERS[i] for i in x[1]) == windows[1]
    assert "".join(SHAKESPEARE_LETTERS[i] for i in y) == text[80:83]
    write_leaf(tmp_path, "train", [{"HAMLET": {"x": ["~" * 80], "y": ["a"]}}])
    with pytest.raises(ValueError, match="character '~' is outside LEAF's 80-letter vocabulary"):
        LeafShakespeare(str(tmp_path)).client_batches(0, generator=torch.Generator(), num_epochs=1)


def leaf_line_to_indices(line: str, word2id: dict[str, int], max_words: int = 25) -> list[int]:
    """LEAF's ``models/utils/language_utils.py``, transcribed: the reference the loader must match."""
    unk_id = len(word2id)
    line_list = re.findall(r"[\w']+|[.,!?;]", line)
    indl = [word2id[w] if w in word2id else unk_id for w in line_list[:max_words]]
    indl += [unk_id] * (max_words - len(indl))
    return indl


def test_sent140_tokens_follow_leaf(tmp_path: Path) -> None:
    vocab = ["the", "movie", "was", "n't", "good", ".", "!", "i", "loved", "it"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tweets = ["I loved the movie!!! it wasn't good.", " ".join(["the"] * 30)]
    x = [["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", tweet] for tweet in tweets]
    write_leaf(tmp_path, "train", [{"user": {"x": x, "y": [1, 0]}}])
    write_leaf(tmp_path, "test", [{"user": {"x": x[:1], "y": [1]}}])
    data = LeafSent140(str(tmp_path), vocab_file=str(tmp_path / "vocab.txt"), shuffle=False)
    (tokens, labels), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    word2id = {w: i for i, w in enumerate(vocab)}
    assert tokens.tolist() == [leaf_line_to_indices(t, word2id) for t in tweets] and labels.tolist() == [1, 0]
    with pytest.raises(FileNotFoundError, match="LeafSent140: .*nope.txt' does not exist.*get_embs.sh"):
        LeafSent140(str(tmp_path), vocab_file=str(tmp_path / "nope.txt"))


def test_celeba_reads_images_from_leafs_raw_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="img_align_celeba' does not exist"):
        LeafCelebA(str(tmp_path))
    images = tmp_path / "data" / "raw" / "img_align_celeba"
    images.mkdir(parents=True)
    Image.new("RGB", (178, 218), (10, 200, 30)).save(images / "000001.jpg", quality=100)
    Image.new("L", (178, 218), 128).save(images / "000002.png")
    write_leaf(tmp_path, "train", [{"7": {"x": ["000001.jpg", "000002.png"], "y": [1, 0]}}])
    write_leaf(tmp_path, "test", [{"7": {"x": ["000002.png"], "y": [0]}}])
    data = LeafCelebA(str(tmp_path), shuffle=False)
    (x, y), = data.client_batches(0, generator=torch.Generator(), num_epochs=1)
    assert x.shape == (2, 3, 84, 84) and y.tolist() == [1, 0]
    assert torch.allclose(x[0].mean(dim=(1, 2)), torch.tensor([10, 200, 30]) / 255, atol=2 / 255)  # JPEG rounding
    assert torch.equal(x[1], torch.full((3, 84, 84), 128 / 255))  # grey, converted to RGB as LEAF does


def test_femnist_trains_through_federated_trainer(femnist_root: Path) -> None:
    from fl_lightning.models import MLP

    model = MLP(in_features=784, hidden=(8,), num_classes=62, lr=0.1)
    trainer = FederatedTrainer(**QUIET, max_epochs=2, clients_per_round=2, local_steps=1)
    trainer.fit(model, datamodule=LeafFEMNIST(str(femnist_root), val_fraction=0.3))
    result = trainer.test(model, datamodule=LeafFEMNIST(str(femnist_root)), verbose=False)
    assert 0 <= result[0]["test_acc"] <= 1


@pytest.mark.usefixtures("cli_in_tmp_path")
def test_fl_lightning_fit_and_test_run_a_leaf_config(femnist_root: Path, tmp_path: Path) -> None:
    from fl_lightning.cli import main

    config = tmp_path / "femnist.yaml"
    config.write_text(
        f"""
trainer: {{max_epochs: 2, clients_per_round: 2, local_steps: 1, accelerator: cpu, logger: false, enable_progress_bar: false}}
model:
  class_path: fl_lightning.models.MLP
  init_args: {{in_features: 784, hidden: [8], num_classes: 62}}
data:
  class_path: fl_lightning.data.LeafFEMNIST
  init_args: {{root: {str(femnist_root)!r}, val_fraction: 0.3, batch_size: 4}}
"""
    )
    main(["fit", "--config", str(config)])
    main(["test", "--config", str(config)])


#: The options LEAF's ``data/utils/preprocess.sh`` parses (its ``case`` statement), and whether each takes a value.
#: Any other word is skipped silently by its ``*)`` branch: ``-tf 0.8`` leaves the default 0.9 split.
LEAF_PREPROCESS_OPTIONS = {
    "--name": True, "-s": True, "--iu": True, "--sf": True, "-k": True, "-t": True, "--tf": True,
    "--smplseed": True, "--spltseed": True, "--nochecksum": False, "--verify": True,
    "--raw": False,  # data/shakespeare/preprocess.sh's own (raw text in all_data.json)
}  # fmt: skip
REPOSITORY = Path(__file__).resolve().parents[3]


def preprocess_commands() -> list[tuple[str, str]]:
    """Every ``preprocess.sh ...`` command line of the docs, the configs, the benchmarks and the LEAF loaders."""
    files = [*REPOSITORY.glob("*.md"), *REPOSITORY.glob("docs/**/*.md"), *REPOSITORY.glob("configs/**/*.yaml")]
    files += [*REPOSITORY.glob("benchmarks/*.py"), *REPOSITORY.glob("benchmarks/**/*.md"), *REPOSITORY.glob("fl_lightning/**/*.py")]
    found = []
    for path in files:
        for match in re.finditer(r"preprocess\.sh((?: +-{1,2}[\w-]+(?: +[\w.${}]+)?)+)", path.read_text(encoding="utf-8")):
            found.append((str(path.relative_to(REPOSITORY)), match.group(1)))
    return found


def test_every_documented_leaf_command_uses_only_options_preprocess_sh_parses() -> None:
    commands = preprocess_commands()
    assert len({path for path, _ in commands}) >= 4  # docs/datasets.md, leaf.py, both LEAF configs
    for path, command in commands:
        words = command.split()
        while words:
            option = words.pop(0)
            assert option in LEAF_PREPROCESS_OPTIONS, f"{path}: preprocess.sh{command} passes {option!r}, which LEAF ignores"
            if LEAF_PREPROCESS_OPTIONS[option]:
                assert words and not words[0].startswith("-"), f"{path}: {option} needs a value in preprocess.sh{command}"
                words.pop(0)


@pytest.mark.parametrize("window", [7, 64, 1000])
def test_the_index_reads_a_file_through_a_small_window_as_it_reads_it_whole(tmp_path: Path, window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """LEAF writes a split as one file (hundreds of MB): the index reads it forward through a window, which must
    give the spans and counts of a whole read wherever the window's edges fall (users of numbers and of strings)."""
    from fl_lightning.data.datasets import leaf_json

    rng = np.random.default_rng(0)
    femnist = {f"f{i}": femnist_user(i, 1 + i % 4) for i in range(12)}
    text = "".join(rng.choice(list(SHAKESPEARE_LETTERS), 400))
    roles = {f'R "{i}" é': {"x": [text[j : j + 80] for j in range(i)], "y": [text[80 + j] for j in range(i)]} for i in range(1, 9)}
    for name, users in (("femnist", femnist), ("shakespeare", roles)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"users": list(users), "num_samples": [0] * len(users), "user_data": users}, indent=1))
        ids, counts, spans = leaf_json.index_leaf_file(path)
        monkeypatch.setattr(leaf_json, "WINDOW", window)
        small_ids, small_counts, small_spans = leaf_json.index_leaf_file(path)
        monkeypatch.undo()
        assert small_ids == ids == list(users) and np.array_equal(small_counts, counts) and np.array_equal(small_spans, spans)
        assert counts.tolist() == [len(u["y"]) for u in users.values()]
        raw = path.read_bytes()
        assert all(json.loads(raw[a:b]) == users[u] for u, (a, b) in zip(ids, spans.tolist()))
