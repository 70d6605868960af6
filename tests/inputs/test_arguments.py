"""The bad-input table: every numeric argument of the trainer, the algorithms, privacy, robust rules, codecs,
participation models, data and models refuses NaN, infinities, negatives and zero where they mean nothing, with
one line that names the argument and the value."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from fl_lightning import FederatedTrainer
from fl_lightning import algorithms as A
from fl_lightning import compression as C
from fl_lightning import data as D
from fl_lightning import models as M
from fl_lightning import participation as P
from fl_lightning import privacy as DP
from fl_lightning import robust as R

NAN, INF = math.nan, math.inf
REAL = (NAN, INF, -INF)  # refused by every finite check
POSITIVE = (*REAL, -1.0, 0.0)  # refused where only > 0 means something
NON_NEGATIVE = (*REAL, -1.0)
COUNT = (NAN, INF, -1, 0, 2.5)  # refused where only an integer >= 1 means something


def _trainer(**kwargs: Any) -> FederatedTrainer:
    return FederatedTrainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)


#: (owner, argument, build with the bad value, bad values)
TABLE: list[tuple[str, str, Callable[[Any], object], tuple[Any, ...]]] = [
    ("FederatedTrainer", "accumulate_grad_batches", lambda v: _trainer(accumulate_grad_batches=v), (-2, 0, 1.5)),
    ("FederatedTrainer", "log_every_n_steps", lambda v: _trainer(log_every_n_steps=v), (0, -1)),
    ("FederatedTrainer", "gradient_clip_val", lambda v: _trainer(gradient_clip_val=v), NON_NEGATIVE),
    ("FederatedTrainer", "max_time", lambda v: _trainer(max_time=v), ("-00:00:01:00", "00:00:00:00", {"hours": -1}, "1h")),
    ("FederatedTrainer", "max_epochs", lambda v: _trainer(max_epochs=v), (-2, 1.5)),
    ("FederatedTrainer", "min_epochs", lambda v: _trainer(min_epochs=v, max_epochs=2), (-1, 3)),
    ("FederatedTrainer", "min_steps", lambda v: _trainer(min_steps=v, max_steps=2), (-1, 3)),
    ("FederatedTrainer", "check_val_every_n_epoch", lambda v: _trainer(check_val_every_n_epoch=v), (0, -1)),
    ("FederatedTrainer", "local_epochs", lambda v: _trainer(local_epochs=v), (0, -1, 1.5)),
    ("FederatedTrainer", "local_steps", lambda v: _trainer(local_steps=v), (0, -1)),
    ("FederatedTrainer", "clients_per_round", lambda v: _trainer(clients_per_round=v), (0, -1, 1.5, NAN)),
    ("FederatedTrainer", "num_clients", lambda v: _trainer(num_clients=v), (0, -1)),
    ("FedProx", "mu", lambda v: A.FedProx(mu=v), NON_NEGATIVE),
    ("FedBuff", "server_lr", lambda v: A.FedBuff(server_lr=v), POSITIVE),
    ("FedBuff", "buffer_size", lambda v: A.FedBuff(buffer_size=v), COUNT),
    ("FedBuff", "concurrency", lambda v: A.FedBuff(concurrency=v), COUNT),
    ("FedBuff", "max_staleness", lambda v: A.FedBuff(max_staleness=v), (NAN, INF, -1)),
    ("FedAsync", "a", lambda v: A.FedAsync(a=v), POSITIVE),
    ("FedAsync", "b", lambda v: A.FedAsync(b=v), NON_NEGATIVE),
    ("FedAsync", "rho", lambda v: A.FedAsync(rho=v), NON_NEGATIVE),
    ("FedAsync", "alpha", lambda v: A.FedAsync(alpha=v), (NAN, 0.0, 1.5)),
    ("ServerSGD", "lr", lambda v: A.ServerSGD(lr=v), POSITIVE),
    ("ServerAdam", "lr", lambda v: A.ServerAdam(lr=v), POSITIVE),
    ("ServerAdam", "tau", lambda v: A.ServerAdam(tau=v), POSITIVE),
    ("ServerYogi", "tau", lambda v: A.ServerYogi(tau=v), (NAN, INF)),
    ("ServerAdagrad", "lr", lambda v: A.ServerAdagrad(lr=v), (NAN, INF)),
    ("FedSoft", "lam", lambda v: A.FedSoft(lam=v), NON_NEGATIVE),
    ("FedSoft", "probe_batch_size", lambda v: A.FedSoft(probe_batch_size=v), COUNT),
    ("IFCA", "personal_eval_every", lambda v: A.IFCA(personal_eval_every=v), (NAN, INF, -1)),
    ("FlexibleParticipation", "reboot_boost", lambda v: A.FlexibleParticipation(reboot_boost=v), NON_NEGATIVE),
    ("StalenessTracker", "window", lambda v: A.StalenessTracker(window=v), COUNT),
    ("StalenessTracker", "unseen", lambda v: A.StalenessTracker(unseen=v), NON_NEGATIVE),
    ("StepEpsilon", "every", lambda v: A.StepEpsilon(every=v), COUNT),
    ("LinearEpsilon", "finish", lambda v: A.LinearEpsilon(finish=v), (NAN, INF, 0)),
    ("FedALIGN", "priority", lambda v: A.FedALIGN(priority=v), (NAN, INF, 0, -1)),
    ("Ditto", "lam", lambda v: A.Ditto(lam=v), (NAN, INF, -1.0)),
    ("FedMRN", "alpha", lambda v: A.FedMRN(alpha=v), POSITIVE),
    ("FedAvgSM", "alpha", lambda v: A.FedAvgSM(alpha=v), (NAN, INF)),
    ("MaskedNoiseCodec", "alpha", lambda v: C.MaskedNoiseCodec(alpha=v), POSITIVE),
    ("TopKCodec", "density", lambda v: C.TopKCodec(density=v), (NAN, 0.0, -1.0, 1.5)),
    ("DPFedAvg", "noise_multiplier", lambda v: DP.DPFedAvg(noise_multiplier=v), (NAN, INF, -1.0)),
    ("DPFedAvg", "clip_norm", lambda v: DP.DPFedAvg(noise_multiplier=1.0, clip_norm=v), POSITIVE),
    ("DPFedAvg", "delta", lambda v: DP.DPFedAvg(noise_multiplier=1.0, delta=v), (NAN, 0.0, -1.0, 1.0)),
    ("LocalDP", "clip_norm", lambda v: DP.LocalDP(noise_multiplier=1.0, clip_norm=v), POSITIVE),
    ("AdaptiveClipping", "target_quantile", lambda v: DP.AdaptiveClipping(target_quantile=v), (NAN, -1.0, 1.5)),
    ("TrimmedMean", "beta", lambda v: R.TrimmedMean(beta=v), (NAN, -0.1, 0.5)),
    ("Krum", "num_byzantine", lambda v: R.Krum(num_byzantine=v), (-1, 1.5)),
    ("GaussianUpdate", "std", lambda v: R.GaussianUpdate(std=v), (NAN, INF, -1.0)),
    ("LogNormalDelay", "mu", lambda v: P.LogNormalDelay(mu=v), REAL),
    ("LogNormalDelay", "sigma", lambda v: P.LogNormalDelay(sigma=v), NON_NEGATIVE),
    ("ExponentialDelay", "mean", lambda v: P.ExponentialDelay(mean=v), POSITIVE),
    ("Arrival", "round", lambda v: P.Arrival(client=0, round=v), (NAN, INF, -1)),
    ("Departure", "client", lambda v: P.Departure(client=v, round=1), (NAN, -1)),
    ("Departure", "heuristic_scale", lambda v: P.Departure(client=0, round=1, heuristic_scale=v), NON_NEGATIVE),
    ("ObjectiveSchedule", "local_steps", lambda v: P.ObjectiveSchedule(num_clients=4, local_steps=v), COUNT),
    ("BinomialSteps", "probability", lambda v: P.BinomialSteps(probability=v), (NAN, -0.1, 1.5)),
    ("Dirichlet", "alpha", lambda v: D.Dirichlet(alpha=v), POSITIVE),
    ("ParetoSizes", "shape", lambda v: D.ParetoSizes(shape=v), POSITIVE),
    ("FedProxSynthetic", "alpha", lambda v: D.FedProxSynthetic(alpha=v), NON_NEGATIVE),
    ("FedProxSynthetic", "seed", lambda v: D.FedProxSynthetic(seed=v), (NAN, -1)),
    ("SyntheticRegressionMixture", "noise_std", lambda v: D.SyntheticRegressionMixture(noise_std=v), NON_NEGATIVE),
    ("SyntheticTopicText", "topic_concentration", lambda v: D.SyntheticTopicText(topic_concentration=v), POSITIVE),
    ("PrioritizedSynthetic", "label_noise", lambda v: D.PrioritizedSynthetic(label_noise=v), NON_NEGATIVE),
    ("Digits", "seed", lambda v: D.Digits(seed=v), (NAN, -1)),
    ("ClassificationModule", "lr", lambda v: M.LogisticRegression(lr=v), POSITIVE),
    ("ClassificationModule", "momentum", lambda v: M.MLP(momentum=v), NON_NEGATIVE),
    ("ClassificationModule", "weight_decay", lambda v: M.CNN(weight_decay=v), NON_NEGATIVE),
    ("ClassificationModule", "num_classes", lambda v: M.LogisticRegression(num_classes=v), (NAN, 1, 2.5)),
    ("LogisticRegression", "in_features", lambda v: M.LogisticRegression(in_features=v), COUNT),
    ("LinearRegression", "lr", lambda v: M.LinearRegression(lr=v), POSITIVE),
    ("LinearRegression", "out_features", lambda v: M.LinearRegression(out_features=v), COUNT),
    ("CNN", "in_channels", lambda v: M.CNN(in_channels=v), COUNT),
    ("ShakespeareLSTM", "num_layers", lambda v: M.ShakespeareLSTM(num_layers=v), COUNT),
    ("StackOverflowLSTM", "vocab_size", lambda v: M.StackOverflowLSTM(vocab_size=v, hidden=4, embedding_dim=2), (0, -1)),
    ("TagLogisticRegression", "k", lambda v: M.TagLogisticRegression(num_words=4, num_tags=3, k=v), (NAN, INF, 0)),
    ("ResNet18GN", "crop", lambda v: M.ResNet18GN(crop=v), (NAN, 0)),
]

CASES = [pytest.param(build, argument, bad, id=f"{owner}.{argument}={bad!r}") for owner, argument, build, bad_values in TABLE for bad in bad_values]


def _shown(value: Any) -> str:
    """How a message shows ``value``: its repr, or for a whole-number float also as an int."""
    return f"({re.escape(repr(value))}|{re.escape(repr(int(value)))})" if isinstance(value, float) and value.is_integer() else re.escape(repr(value))


def test_the_table_has_at_least_150_cases() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize(("build", "argument", "bad"), CASES)
def test_a_bad_number_is_one_line_naming_the_argument_and_the_value(build: Callable[[Any], object], argument: str, bad: Any) -> None:
    with pytest.raises((ValueError, TypeError)) as caught:
        build(bad)
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(rf"\b{re.escape(argument)}\b.*{_shown(bad)}", message), message
