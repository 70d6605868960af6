"""A client whose last batch holds 1 sample under BatchNorm: one error naming the client, the round and the
fix, from every executor, and one ``error:`` line (exit status 2) from ``fl-lightning`` mid-run."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.cli.errors import EXIT_STATUS, RunStarted, configuration_errors
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.data._data_checks import ClientDataError

from ..algorithms.fedmrn_fixtures import Tiny, trainer


def eleven_and_ten() -> FederatedDataModule:
    """21 samples over 2 IID clients of 11 and 10: in batches of 10, the first client's last holds 1 sample."""
    inputs = torch.randn(21, 64, generator=torch.Generator().manual_seed(0))
    data = InMemoryDataset(inputs=inputs, labels=torch.arange(21) % 10, num_classes=10)
    return FederatedDataModule(data, num_clients=2, batch_size=10)


@pytest.mark.parametrize("executor", ["lightning", "lean", "batched"])
def test_a_one_sample_batch_under_batch_norm_names_the_client(executor: str) -> None:
    data = eleven_and_ten()
    data.setup("fit")
    client = next(c for c in range(2) if data.client_num_samples(c) == 11)
    run = trainer(max_epochs=1, clients_per_round=2, local_epochs=1, client_executor=executor)
    message = rf"^Client {client} \(11 samples\) has a batch of 1 sample in round 0, .* drop_last=True"
    with pytest.raises(ClientDataError, match=message):
        run.fit(Tiny(batch_norm=True), datamodule=data)


def test_the_cli_reports_it_as_one_line_although_the_run_started(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FL_LIGHTNING_DEBUG", raising=False)
    started = RunStarted()
    started.started = True
    with pytest.raises(SystemExit) as exit_, configuration_errors(started):
        raise ClientDataError("Client 3 (11 samples) has a batch of 1 sample in round 0, ...")
    assert exit_.value.code == EXIT_STATUS
    assert capsys.readouterr().err == "error: Client 3 (11 samples) has a batch of 1 sample in round 0, ...\n"
    with pytest.raises(ValueError, match="a bug"), configuration_errors(started):  # any other error keeps its traceback
        raise ValueError("a bug")
