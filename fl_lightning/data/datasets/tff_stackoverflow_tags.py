"""TFF's StackOverflow, tag prediction: the "Stack Overflow LR" task of Reddi et al. 2021 (App. C.4)."""

from __future__ import annotations

import json
from typing import Any, Literal

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.datasets.multi_hot import MultiHotRows
from fl_lightning.data.datasets.tff import stackoverflow_counts, stackoverflow_splits, stackoverflow_words
from fl_lightning.data.natural import NaturalDataModule


class TffStackOverflowTags(NaturalDataModule):
    """TFF's StackOverflow (``stackoverflow.sqlite``), tag prediction: a post's bag of words -> its tags
    (multi-label), with the users and splits of :class:`~fl_lightning.data.datasets.tff.TffStackOverflow`
    (the held-out split is the server's validation set).

    TFF's ``tag_prediction_preprocessing``: the words are ``tokens + " " + title`` split on whitespace,
    the tags ``tags`` split on ``"|"``. A sample is ``(x, y)``: ``x`` the ``[vocab_size]`` bag of words
    (word ``i`` of the vocabulary is column ``i``; other words have none), ``y`` the ``[tag_vocab_size]``
    counts of the post's vocabulary tags (0/1: a post lists a tag once; other tags have none). ``x`` is
    normalised by ``normalize``:

    - ``"vocabulary"`` (TFF's baseline, ``tff.simulation.baselines.stackoverflow``): the vocabulary words'
      counts divided by their sum (a row sums to 1; all zero for a post without vocabulary words);
    - ``"all_words"`` (Reddi et al.'s code, ``utils/datasets/stackoverflow_lr_dataset.py`` of
      google-research/federated): divided by the number of all the post's words, out-of-vocabulary ones
      included (a row sums to the share of vocabulary words; zero for an empty post, where theirs is NaN).

    The vocabularies are the first ``vocab_size`` words of ``stackoverflow.word_count`` (one ``word count`` a
    line, most frequent first) and the ``tag_vocab_size`` most frequent tags of ``stackoverflow.tag_count`` (a
    JSON object ``{tag: count}``, sorted by count as TFF's ``load_tag_counts`` does: ties keep the file's order).

    A client's posts are kept as word and tag ids (:class:`~fl_lightning.data.datasets.multi_hot.MultiHotRows`);
    the dense ``[B, vocab_size]`` and ``[B, tag_vocab_size]`` rows exist only for the batch being trained or
    evaluated (a dense bag per post would be 40 kB: 4 GB for a client of 100,000 posts).

    Args:
        root: The folder holding ``stackoverflow.sqlite``, ``stackoverflow.word_count`` and ``stackoverflow.tag_count``.
        vocab_size: Words in the vocabulary (Reddi et al.: 10,000).
        tag_vocab_size: Tags predicted (Reddi et al.: 500).
        normalize: How the bag of words is normalised: ``"vocabulary"`` or ``"all_words"`` (above).
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s (not ``val``/``val_fraction``: the
            held-out split is the validation set).
    """

    def __init__(
        self,
        root: str,
        *,
        vocab_size: int = 10_000,
        tag_vocab_size: int = 500,
        normalize: Literal["vocabulary", "all_words"] = "vocabulary",
        **kwargs: Any,
    ) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.tag_vocab_size = check_int("tag_vocab_size", tag_vocab_size, minimum=1)
        check_choice("normalize", normalize, ["vocabulary", "all_words"])
        self.normalize = normalize
        self.vocab = stackoverflow_words(root, vocab_size, dataset="TffStackOverflowTags")
        counts = json.loads(stackoverflow_counts(root, "tag_count", dataset="TffStackOverflowTags").read_text("utf-8"))
        self.tags = sorted(counts, key=counts.__getitem__, reverse=True)[:tag_vocab_size]  # stable, as TFF's
        self._word_id = {word.encode(): index for index, word in enumerate(self.vocab)}
        self._tag_id = {tag.encode(): index for index, tag in enumerate(self.tags)}
        train, val, test = stackoverflow_splits(root, self._bags, dataset="TffStackOverflowTags")  # type: ignore[arg-type]
        super().__init__(train, test, val=val, **kwargs)

    def _bags(self, examples: list[dict[str, Any]]) -> tuple[MultiHotRows, MultiHotRows]:
        word_ids, divisors, tag_ids = [], [], []
        for example in examples:
            words = (example["tokens"][0] + b" " + example["title"][0]).split()
            ids = [self._word_id[w] for w in words if w in self._word_id]
            word_ids.append(ids)
            divisors.append(len(ids) if self.normalize == "vocabulary" else len(words))
            tag_ids.append([self._tag_id[t] for t in example["tags"][0].split(b"|") if t in self._tag_id])
        return MultiHotRows(word_ids, len(self.vocab), divisors), MultiHotRows(tag_ids, len(self.tags))
