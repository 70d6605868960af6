"""Synthetic token sequences whose clients write in their own mix of topics: offline text for federated LMs.

Each topic is a sparse first-order Markov chain over a small vocabulary; each client draws its topic
mixture from a Dirichlet, so clients differ in what they write (non-IID) the way users of a real
corpus differ in subject (the construction of topic-mixture synthetic federations, e.g. the
"mixture of sources" of FedSoft, Ruan & Joe-Wong 2022, applied to Markov text). Nothing is
downloaded; the data is a function of the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.datasets.in_memory import InMemoryDataset
from fl_lightning.utils.checks import positive

#: Streams of the seed: the topics' chains, the clients' mixtures and sizes, their sequences.
_CHAINS, _CLIENTS, _SEQUENCES = 0, 1, 2


def topic_chains(num_topics: int, vocab_size: int, successors: int, rng: np.random.Generator) -> np.ndarray:
    """``[K, V, V]`` transition matrices: from each token, topic ``k`` moves to ``successors`` tokens drawn
    without replacement, with Dirichlet(1) probabilities (so a topic's text is predictable, and topics differ)."""
    chains = np.zeros((num_topics, vocab_size, vocab_size))
    for k in range(num_topics):
        for token in range(vocab_size):
            nxt = rng.choice(vocab_size, size=successors, replace=False)
            chains[k, token, nxt] = rng.dirichlet(np.ones(successors))
    return chains


class SyntheticTopicText(InMemoryDataset):
    """Token sequences of ``num_clients`` synthetic writers, one split of them (synthetic: no real text).

    Client ``c`` has a topic mixture ``pi_c ~ Dirichlet(topic_concentration)`` over ``num_topics`` topics
    (small concentrations: most clients write mostly one or two topics) and ``n_c`` sequences, uniform in
    ``sequences_per_client``. Each sequence draws its topic from ``pi_c``, a uniform first token, then
    ``seq_len - 1`` steps of that topic's Markov chain (:func:`topic_chains`). Each client's last
    ``max(1, round(test_fraction * n_c))`` sequences form the ``test`` split, the rest ``train``; both splits
    built with one ``seed`` come from the same clients (as :class:`~fl_lightning.data.FedProxSynthetic`'s).

    Samples are ``(tokens, topic)``: ``[seq_len]`` int64 ids in ``[0, vocab_size)`` and the sequence's
    topic as its label (ground truth for analysis; a causal LM reads only the tokens, and
    :class:`~fl_lightning.data.Dirichlet` over topics gives a label-skew split of the same text).
    ``client_ids`` makes :class:`~fl_lightning.data.Natural` give each writer its own sequences.

    Args:
        num_clients: Writers.
        num_topics: Topics (Markov chains).
        vocab_size: Token ids.
        seq_len: Tokens per sequence.
        sequences_per_client: One count for every client, or ``[low, high]`` (inclusive), at least 2.
        topic_concentration: Dirichlet concentration of the clients' mixtures (> 0; large: every client
            writes every topic alike, near IID).
        successors: Next tokens a topic allows after each token, in ``[1, vocab_size]`` (the chains' sparsity).
        test_fraction: Share of each client's sequences in the test split, in ``(0, 1)``.
        split: ``"train"`` or ``"test"``.
        seed: Seed of the whole dataset.

    Attributes:
        client_ids: The writer of each sequence, for :class:`~fl_lightning.data.Natural`.
        mixtures: ``[num_clients, num_topics]`` topic mixture of each writer.
        oracle_nll: Mean next-token negative log-likelihood (nats) of this split under the chain that
            wrote each sequence, its topic known: a floor no model reaches (``exp`` of it: a perplexity floor).
    """

    def __init__(
        self,
        *,
        num_clients: int = 39,
        num_topics: int = 4,
        vocab_size: int = 64,
        seq_len: int = 32,
        sequences_per_client: int | Sequence[int] = (20, 60),
        topic_concentration: float = 0.3,
        successors: int = 4,
        test_fraction: float = 0.2,
        split: Literal["train", "test"] = "train",
        seed: int = 0,
    ) -> None:
        num_clients = check_int("num_clients", num_clients, minimum=1)
        num_topics = check_int("num_topics", num_topics, minimum=1)
        vocab_size = check_int("vocab_size", vocab_size, minimum=2)
        seq_len = check_int("seq_len", seq_len, minimum=2)
        successors = check_int("successors", successors, minimum=1)
        if successors > vocab_size:
            raise ValueError(f"`successors` must be at most vocab_size={vocab_size}, got {successors}.")
        positive("topic_concentration", topic_concentration)
        if not 0 < test_fraction < 1:
            raise ValueError(f"`test_fraction` must lie in (0, 1), got {test_fraction!r}.")
        check_choice("split", split, ("train", "test"))
        seed = check_int("seed", seed, minimum=0)

        chains = topic_chains(num_topics, vocab_size, successors, np.random.default_rng([seed, _CHAINS]))
        layout = np.random.default_rng([seed, _CLIENTS])
        self.mixtures: np.ndarray = layout.dirichlet(np.full(num_topics, float(topic_concentration)), size=num_clients)
        sizes = _sizes(sequences_per_client, num_clients, layout)
        rng = np.random.default_rng([seed, _SEQUENCES])
        tokens, topics, clients, nll = [], [], [], []
        for c, n in enumerate(sizes):
            z = rng.choice(num_topics, size=n, p=self.mixtures[c])
            x = np.empty((n, seq_len), dtype=np.int64)
            x[:, 0] = rng.integers(vocab_size, size=n)
            for t in range(1, seq_len):
                cumulative = chains[z, x[:, t - 1]].cumsum(axis=1)
                x[:, t] = np.minimum((cumulative < rng.random((n, 1)) * cumulative[:, -1:]).sum(axis=1), vocab_size - 1)
            held = max(1, round(test_fraction * n))
            part = slice(None, n - held) if split == "train" else slice(n - held, None)
            tokens.append(x[part])
            topics.append(z[part])
            clients.append(np.full(len(z[part]), c, dtype=np.int64))
            steps = chains[z[part][:, None], x[part][:, :-1], x[part][:, 1:]]
            nll.append(-np.log(steps))
        super().__init__(
            inputs=torch.from_numpy(np.concatenate(tokens)),
            labels=torch.from_numpy(np.concatenate(topics)),
            num_classes=num_topics,
        )
        self.client_ids: np.ndarray = np.concatenate(clients)
        self.oracle_nll: float = float(np.concatenate(nll).mean())


def _sizes(sequences_per_client: int | Sequence[int], num_clients: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(sequences_per_client, (int, np.integer)):
        return np.full(num_clients, check_int("sequences_per_client", sequences_per_client, minimum=2))
    if len(sequences_per_client) != 2 or not 2 <= sequences_per_client[0] <= sequences_per_client[1]:
        raise ValueError(
            f"`sequences_per_client` must be an int >= 2 or a range [low, high] with 2 <= low <= high, got {sequences_per_client!r}."
        )
    low, high = (int(v) for v in sequences_per_client)
    return rng.integers(low, high + 1, num_clients)
