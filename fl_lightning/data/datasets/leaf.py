"""LEAF's federated datasets (Caldas et al. 2018, https://leaf.cmu.edu): FEMNIST, Shakespeare, Sent140, CelebA.

Each reads the JSON files LEAF's ``preprocess.sh`` writes under ``<root>/data/{train,test}`` (``root`` is
LEAF's ``data/<name>`` folder); LEAF's ``train``/``test`` folders are the standard split. The clients
are LEAF's users, sorted by id; ``docs/datasets.md`` gives each dataset's command, size and layout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from fl_lightning.data.client_reader import missing_data_error
from fl_lightning.data.datasets.leaf_json import LeafJsonReader
from fl_lightning.data.natural import NaturalDataModule

_LEAF = "https://github.com/TalwalkarLab/leaf"


class LeafDataModule(NaturalDataModule):
    """A LEAF dataset: the users of ``<root>/data/train`` train, ``<root>/data/test`` tests.

    Args:
        root: LEAF's folder of the dataset (``leaf/data/<name>``), holding ``data/train`` and ``data/test``.
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s (``val_fraction``, ``batch_size``, ...).
    """

    #: LEAF's name of the dataset (its folder under ``leaf/data``).
    name: ClassVar[str]
    #: The ``preprocess.sh`` call of LEAF's README for the full dataset, with the options as LEAF's
    #: ``data/utils/preprocess.sh`` parses them (it silently skips any other word).
    command: ClassVar[str]

    def __init__(self, root: str, **kwargs: Any) -> None:
        self.root = Path(root)
        source = f"{_LEAF} (cd data/{self.name} && {self.command})"
        train = LeafJsonReader(self.root / "data" / "train", self.decode, dataset=type(self).__name__, source=source)
        test = LeafJsonReader(self.root / "data" / "test", self.decode, dataset=type(self).__name__, source=source)
        super().__init__(train, test, **kwargs)

    def decode(self, x: list[Any], y: list[Any]) -> tuple[Tensor, Tensor]:
        """One user's ``x`` and ``y`` lists as ``(inputs, labels)`` tensors."""
        raise NotImplementedError


class LeafFEMNIST(LeafDataModule):
    """LEAF's FEMNIST: 3,550 writers of 62-class handwritten characters, 805,263 samples.

    A sample is a ``[1, 28, 28]`` float image as LEAF stores it (values in ``[0, 1]``); labels are
    ``0-9`` digits, ``10-35`` upper case, ``36-61`` lower case.
    """

    name = "femnist"
    command = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"
    num_classes = 62

    def decode(self, x: list[Any], y: list[Any]) -> tuple[Tensor, Tensor]:
        return torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 28, 28), torch.tensor(y, dtype=torch.int64)


#: LEAF's Shakespeare vocabulary (``models/utils/language_utils.py``): a character's index is its position.
SHAKESPEARE_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_LETTER_INDEX = {letter: index for index, letter in enumerate(SHAKESPEARE_LETTERS)}


class LeafShakespeare(LeafDataModule):
    """LEAF's Shakespeare: 1,129 speaking roles, next-character prediction, 4,226,158 samples.

    A sample is LEAF's 80-character window as ``int64`` indices into :data:`SHAKESPEARE_LETTERS` (80
    characters), the label the index of the character after it. A character outside that vocabulary
    raises ``ValueError`` naming it (LEAF's own ``letter_to_index`` would silently give ``-1``).

    LEAF's README writes the split option ``-tf 0.8`` (the FedAvg paper's 80/20 split), but its
    ``preprocess.sh`` parses only ``--tf``: ``-tf 0.8`` is skipped and the split is the default 0.9.
    :attr:`command` says ``--tf 0.8``. A user's test windows start 79 after its training windows
    (LEAF's ``split_data.py``), and its count is what the file holds (see :mod:`.leaf_json`).
    """

    name = "shakespeare"
    command = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample --tf 0.8"
    num_classes = len(SHAKESPEARE_LETTERS)
    sequence_length = 80

    def decode(self, x: list[Any], y: list[Any]) -> tuple[Tensor, Tensor]:
        if any(len(window) != self.sequence_length for window in x):
            raise ValueError(f"LeafShakespeare: every x must be {self.sequence_length} characters (LEAF's windows).")
        return torch.tensor([_letters(window) for window in x], dtype=torch.int64), torch.tensor(
            [_letters(letter)[0] for letter in y], dtype=torch.int64
        )


def _letters(text: str) -> list[int]:
    try:
        return [_LETTER_INDEX[letter] for letter in text]
    except KeyError as error:
        raise ValueError(f"LeafShakespeare: character {error.args[0]!r} is outside LEAF's 80-letter vocabulary.") from None


class LeafSent140(LeafDataModule):
    """LEAF's Sent140: tweets of 660,120 users, binary sentiment, 1,600,498 samples.

    Tokens follow LEAF's ``models/utils/language_utils.py`` exactly: ``re.findall(r"[\\w']+|[.,!?;]", text)``
    of the tweet (``x[4]``), the first ``max_words`` (25) tokens as indices into ``vocab_file``, an unknown
    word and the padding both ``len(vocab)``. LEAF's vocabulary is GloVe 6B's 400,000 words
    (``models/sent140/get_embs.sh``); ``vocab_file`` is one word per line, in the embedding matrix's order
    (``cut -d' ' -f1 glove.6B.300d.txt > vocab.txt``), so row ``i`` of the GloVe matrix embeds token ``i``.
    A model's embedding needs ``len(vocab) + 1`` rows.

    Args:
        root: LEAF's ``data/sent140`` folder.
        vocab_file: The vocabulary, one word per line.
        max_words: Tokens per tweet (LEAF: 25).
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s.
    """

    name = "sent140"
    command = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample"
    num_classes = 2
    _TOKEN = re.compile(r"[\w']+|[.,!?;]")

    def __init__(self, root: str, vocab_file: str, *, max_words: int = 25, **kwargs: Any) -> None:
        path = Path(vocab_file)
        if not path.is_file():
            raise missing_data_error(
                "LeafSent140", path, source=f"{_LEAF} (models/sent140/get_embs.sh, then one word per line)", folder=path.parent
            )
        self.vocab = path.read_text(encoding="utf-8").splitlines()
        self._word_index = {word: index for index, word in enumerate(self.vocab)}
        self.max_words = max_words
        super().__init__(root, **kwargs)

    def decode(self, x: list[Any], y: list[Any]) -> tuple[Tensor, Tensor]:
        unknown = len(self.vocab)
        rows = np.full((len(x), self.max_words), unknown, dtype=np.int64)
        for row, sample in enumerate(x):
            words = self._TOKEN.findall(sample[4])[: self.max_words]
            rows[row, : len(words)] = [self._word_index.get(word, unknown) for word in words]
        return torch.from_numpy(rows), torch.tensor([int(label) for label in y], dtype=torch.int64)


class LeafCelebA(LeafDataModule):
    """LEAF's CelebA: 9,343 celebrities, smiling or not, 200,288 samples.

    As LEAF's ``models/celeba`` reads them: ``<root>/data/raw/img_align_celeba/<x>`` resized to 84x84
    (Pillow's default filter) in RGB; then, unlike LEAF (which feeds the raw ``0-255`` values), scaled
    to ``[0, 1]`` as a ``[3, 84, 84]`` float tensor, torchvision's ``ToTensor`` convention.
    """

    name = "celeba"
    command = "./preprocess.sh -s niid --sf 1.0 -k 5 -t sample"
    num_classes = 2
    image_size = 84

    def __init__(self, root: str, **kwargs: Any) -> None:
        self.images = Path(root) / "data" / "raw" / "img_align_celeba"
        if not self.images.is_dir():
            source = f"{_LEAF} (data/celeba/README.md: img_align_celeba from the CelebA site)"
            raise missing_data_error("LeafCelebA", self.images, source=source, folder=self.images.parent)
        super().__init__(root, **kwargs)

    def decode(self, x: list[Any], y: list[Any]) -> tuple[Tensor, Tensor]:
        images = np.stack([self._image(name) for name in x]) if x else np.zeros((0, 84, 84, 3), dtype=np.uint8)
        inputs = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)
        return inputs, torch.tensor([int(label) for label in y], dtype=torch.int64)

    def _image(self, name: str) -> np.ndarray:
        with Image.open(self.images / name) as image:
            return np.asarray(image.resize((self.image_size, self.image_size)).convert("RGB"))
