"""Issue 39 item 10: state that decides a guarantee or a number is checked on load against what the run can
produce; each tampering case of the audit is one error naming the checkpoint and the entry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_lightning import IFCA, SCAFFOLD, DPFedAvg, FedAvg, FedBuff, FedSoft, ServerAdam
from fl_lightning.checkpointing.checkpoint_io import CheckpointError
from fl_lightning.participation import ConstantDelay
from fl_lightning.privacy import DPFedBuff
from fl_lightning.privacy.ledger_seal import KEY_ENV

from ..checkpoint_files import load_checkpoint_file
from .algorithm_cases import CASES
from .test_algorithm_state import fit


def _algorithm(state: dict) -> dict:
    return state["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]


def _async(state: dict) -> dict:
    return state["loops"]["fit_loop"]["state_dict"]["federated"]["async"]


def _secure_dp() -> DPFedAvg:
    return DPFedAvg(noise_multiplier=0.5, clip_norm=1.0, secure_mode=True)


def _scale_ledger(state: dict) -> None:
    (setting, count), *_ = _algorithm(state)["spent"]
    setting[0] *= 2  # twice the noise multiplier: half the epsilon


#: name -> (algorithm, edit of the saved checkpoint, the error after "Checkpoint <path>: ").
CASES_10: dict[str, tuple[Callable[[], Any], Callable[[dict], None], str]] = {
    "adam-moment-huge": (
        lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),
        lambda s: _algorithm(s)["server_optimizer"]["m"]["net.1.weight"].fill_(1e30),
        r"FedAvg's saved state is invalid: `server_optimizer\.m\.net\.1\.weight` is out of range: \|m\| / sqrt\(v\) reaches",
    ),
    "adam-second-moment-zero": (
        lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),
        lambda s: _algorithm(s)["server_optimizer"]["v"]["net.1.bias"].zero_(),
        r"`server_optimizer\.v\.net\.1\.bias` must be > 0",
    ),
    "adam-first-moment-missing": (
        lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),
        lambda s: _algorithm(s)["server_optimizer"].pop("m"),
        r"`server_optimizer` holds \['v'\], but ServerAdam keeps `m` and `v` once it has stepped",
    ),
    "adam-moments-removed": (
        lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),
        lambda s: _algorithm(s)["server_optimizer"].clear(),
        r"`server_optimizer` has no m and v after 2 rounds: ServerAdam's moments were removed",
    ),
    "adam-moment-of-one-parameter-missing": (
        lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),
        lambda s: _algorithm(s)["server_optimizer"]["m"].pop("net.1.bias"),
        r"`server_optimizer`'s `m` and `v` must cover the same parameters",
    ),
    "dp-ledger-more-rounds-than-done": (
        CASES[DPFedAvg][0],
        lambda s: _algorithm(s)["spent"][0].__setitem__(1, 7),
        r"the privacy ledger `spent` records 7 releases, but the checkpoint has only 2 rounds done",
    ),
    "dp-secure-ledger-edited": (
        _secure_dp,
        _scale_ledger,
        r"the privacy ledger fails its authentication \(HMAC-SHA256",
    ),
    "dp-secure-clip-norm-edited": (
        _secure_dp,
        lambda s: _algorithm(s).update(clip_norm=1e30),
        r"the privacy ledger fails its authentication",
    ),
    "dp-secure-seal-removed": (
        _secure_dp,
        lambda s: _algorithm(s).pop("spent_seal"),
        r"`spent_seal` is missing",
    ),
    "dp-fedbuff-secure-ledger-edited": (
        lambda: DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, secure_mode=True, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay(1.0))),
        _scale_ledger,
        r"the privacy ledger fails its authentication",
    ),
    "scaffold-client-control-huge": (
        SCAFFOLD,
        lambda s: next(iter(_algorithm(s)["client_controls"]["entries"].values()))["net.1.weight"].fill_(1e30),
        r"`control\.net\.1\.weight` is not the mean of the clients' `client_controls`",
    ),
    "scaffold-server-control-huge": (
        SCAFFOLD,
        lambda s: _algorithm(s)["control"]["net.1.bias"].fill_(1e30),
        r"`control\.net\.1\.bias` is not the mean of the clients' `client_controls`",
    ),
    "fedsoft-u-wrong-shape": (
        CASES[FedSoft][0],
        lambda s: _algorithm(s).update(u=torch.full((3, 2), 0.5, dtype=torch.float64)),
        r"`u` must have shape \[4, 2\], got \[3, 2\]",
    ),
    "fedsoft-u-negative": (
        CASES[FedSoft][0],
        lambda s: _algorithm(s)["u"].__setitem__((0, 0), -0.5),
        r"`u` must be >= 0\.\d+, got a minimum of -0\.5",
    ),
    "fedsoft-selection-of-unknown-client": (
        CASES[FedSoft][0],
        lambda s: _algorithm(s)["selection_history"][0][0].append(999),
        r"`selection_history\[0\]` must be a client id in 0\.\.3, got 999",
    ),
    "three-centres-for-two-clusters": (
        CASES[IFCA][0],
        lambda s: _algorithm(s)["centres"].append(_algorithm(s)["centres"][0]),
        r"`centres` must hold num_clusters=2 centres, got 3",
    ),
    "async-clock-nan": (
        CASES[FedBuff][0],
        lambda s: _async(s).update(clock=float("nan")),
        r"`async\.clock` must be a finite number in \[0, inf\], got nan",
    ),
    "async-queued-client-not-in-flight": (
        CASES[FedBuff][0],
        lambda s: _async(s)["in_flight"].pop(next(iter(_async(s)["in_flight"]))),
        r"`async\.in_flight` must name exactly the queued clients",
    ),
    "async-counters-short": (
        CASES[FedBuff][0],
        lambda s: _async(s)["jobs"].pop(),
        r"`async\.jobs` must hold one int per client \(4\)",
    ),
    "async-event-of-unknown-client": (
        CASES[FedBuff][0],
        lambda s: _async(s)["queue"].append((1e9, 0, 999)),
        r"`async\.queue\[\d+\] client` must be a client id in 0\.\.3, got 999",
    ),
    "async-more-arrivals-than-dispatches": (
        CASES[FedBuff][0],
        lambda s: _async(s).update(arrivals_start=10**6),
        r"`async\.arrivals_start` must be an int >= 0 and <= \d+, got 1000000",
    ),
    "async-update-without-fields": (
        lambda: FedBuff(buffer_size=3, delays=ConstantDelay(1.0)),
        lambda s: [u.pop("num_steps") for u, _ in _async(s)["buffer"]] or _async(s)["buffer"].append(({"client_id": 0}, 0)),
        r"`async\.buffer\[0\]` must be a client update with fields",
    ),
}


@pytest.fixture(autouse=True)
def ledger_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(KEY_ENV, "ab" * 32)
    monkeypatch.chdir(tmp_path)  # a secure-mode run without a logger writes its release log in the working folder


@pytest.mark.parametrize("case", list(CASES_10))
def test_tampered_state_is_one_error_naming_file_and_entry(tmp_path: Path, case: str) -> None:
    make_algorithm, change, message = CASES_10[case]
    fit(tmp_path / "run", make_algorithm, CASES[FedAvg][1], rounds=2)
    state = load_checkpoint_file(tmp_path / "run" / "last.ckpt")
    change(state)
    path = tmp_path / "tampered.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {path}: .*{message}") as raised:
        fit(tmp_path / "resumed", make_algorithm, CASES[FedAvg][1], rounds=3, ckpt_path=path)
    assert "\n" not in str(raised.value)


def test_an_untampered_secure_ledger_resumes_and_another_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fit(tmp_path / "run", _secure_dp, CASES[FedAvg][1], rounds=2)
    fit(tmp_path / "resumed", _secure_dp, CASES[FedAvg][1], rounds=3, ckpt_path=tmp_path / "run" / "last.ckpt")
    monkeypatch.setenv(KEY_ENV, "cd" * 32)
    with pytest.raises(CheckpointError, match="fails its authentication"):
        fit(tmp_path / "other", _secure_dp, CASES[FedAvg][1], rounds=3, ckpt_path=tmp_path / "run" / "last.ckpt")


def test_a_huge_saved_clip_norm_is_not_used_without_adaptive_clipping(tmp_path: Path) -> None:
    fit(tmp_path / "run", CASES[DPFedAvg][0], CASES[FedAvg][1], rounds=2)
    state = load_checkpoint_file(tmp_path / "run" / "last.ckpt")
    _algorithm(state)["clip_norm"] = 1e30
    torch.save(state, tmp_path / "tampered.ckpt")
    clip_norms: list[float] = []
    algorithm = CASES[DPFedAvg][0]()
    original = algorithm.apply_weighted_sum

    def record(*args: Any) -> dict[str, float]:
        clip_norms.append(algorithm.clip_norm)
        return original(*args)

    algorithm.apply_weighted_sum = record  # type: ignore[method-assign]
    fit(tmp_path / "resumed", lambda: algorithm, CASES[FedAvg][1], rounds=3, ckpt_path=tmp_path / "tampered.ckpt")
    assert clip_norms == [1.0]
