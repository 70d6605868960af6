"""ClientStore: spill beyond the memory budget, bit-exact read-back, checkpoints, ownership; the budget's parsing."""

from __future__ import annotations

import copy
import gc
import os
from pathlib import Path

import pytest
import torch

from fl_lightning.algorithms.shared.optimizer_state import (
    flatten_optimizer_states,
    load_optimizer_state,
    optimizer_state_to_cpu,
    unflatten_optimizer_states,
)
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.memory_budget import parse_memory
from fl_lightning.server.spill_arena import SpillArena

ENTRY_BYTES = 100 * 4 + 3 * 8 + 2 * 8  # float32 [10, 10], float64 [3], int64 [2]


def entry(cid: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(cid)
    return {
        "w": torch.randn(10, 10, generator=generator),
        "b": torch.randn(3, generator=generator, dtype=torch.float64),
        "count": torch.tensor([cid, 7 * cid]),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def spill_files(tmp_path: Path) -> list[str]:
    return [f for _, _, files in os.walk(tmp_path) for f in files]


def test_beyond_the_budget_the_least_recently_used_spill_and_come_back_bit_for_bit(tmp_path):
    store = ClientStore()
    store.bind(budget=3 * ENTRY_BYTES, folder=tmp_path)
    for cid in range(10):
        store.put(cid, entry(cid))
        assert store.resident_nbytes() <= 3 * ENTRY_BYTES
    assert len(store) == 10 and store.ids() == list(range(10)) and store.nbytes() == 10 * ENTRY_BYTES
    assert store.spilled_ids() == list(range(7))  # 7, 8, 9 in memory
    assert sorted(spill_files(tmp_path)) == [".lock", "entries.bin"]  # one file for every spilled entry
    assert_same(store.get(0), entry(0))  # read back, now the most recently used: 7 spills
    assert store.spilled_ids() == list(range(1, 8))
    for cid, state in store.items():
        assert_same(state, entry(cid))
    assert 11 not in store and store.get(11) is None and 3 in store
    store.put(3, entry(30))  # a spilled client's new state replaces its entry
    assert 3 not in store.spilled_ids()
    assert_same(store.get(3), entry(30))


def test_an_entry_read_back_and_unchanged_is_evicted_or_set_aside_without_a_write(tmp_path, monkeypatch):
    writes: list[int] = []
    write = SpillArena.write
    monkeypatch.setattr(SpillArena, "write", lambda arena, cid, state: (writes.append(cid), write(arena, cid, state)))
    store = ClientStore()
    store.bind(budget=ENTRY_BYTES, folder=tmp_path)
    for cid in range(3):
        store.put(cid, entry(cid))
    assert writes == [0, 1]
    assert_same(store.get(0), entry(0))  # 2 (new) is written out; 0 keeps its copy in the file
    assert_same(store.get(1), entry(1))  # 0 is evicted as it was read: no write
    assert writes == [0, 1, 2] and store.spilled_ids() == [0, 2]
    store.record_changes()
    store.put(1, entry(10))  # 1's entry before the change is set aside: its copy in the file is renamed
    assert writes == [0, 1, 2]
    store.undo_changes()
    store.stop_recording()
    for cid in range(3):
        assert_same(store.get(cid), entry(cid))


def test_a_zero_budget_keeps_nothing_in_memory_and_an_unbound_store_spills_nothing(tmp_path):
    store = ClientStore()
    store.bind(budget=0, folder=tmp_path)
    store.put(5, entry(5))
    assert store.resident_nbytes() == 0 and store.spilled_ids() == [5]
    assert_same(store.get(5), entry(5))
    unbound = ClientStore()
    for cid in range(4):
        unbound.put(cid, entry(cid))
    assert unbound.resident_nbytes() == 4 * ENTRY_BYTES


def test_put_stores_a_float32_cpu_copy(tmp_path):
    store = ClientStore()
    given = {"w": torch.ones(3, dtype=torch.bfloat16)}
    store.put(1, given)
    given["w"].add_(1)
    assert store.get(1)["w"].dtype == torch.float32 and torch.equal(store.get(1)["w"], torch.ones(3))


def test_state_dict_holds_every_entry_inline_and_loads_into_any_budget(tmp_path):
    spilling, reference = ClientStore(), ClientStore()
    spilling.bind(budget=2 * ENTRY_BYTES, folder=tmp_path / "a")
    for cid in (4, 1, 9, 2, 6):
        spilling.put(cid, entry(cid))
        reference.put(cid, entry(cid))
    saved = spilling.state_dict()
    assert list(saved["entries"]) == [1, 2, 4, 6, 9]
    path = tmp_path / "state.pt"
    torch.save(saved, path)
    del spilling, saved
    gc.collect()
    assert not (tmp_path / "a").exists() or not spill_files(tmp_path / "a")  # the spill folder goes with its store

    loaded = ClientStore()
    loaded.bind(budget=ENTRY_BYTES, folder=tmp_path / "b")
    loaded.load_state_dict(torch.load(path, weights_only=True))
    assert loaded.ids() == reference.ids() and loaded.resident_nbytes() <= ENTRY_BYTES
    for (cid, a), (_, b) in zip(loaded.items(), reference.items()):
        assert_same(a, b)


def test_a_copy_is_independent_of_its_original(tmp_path):
    store = ClientStore()
    store.bind(budget=ENTRY_BYTES, folder=tmp_path)
    for cid in range(3):
        store.put(cid, entry(cid))
    twin = copy.deepcopy(store)
    store.put(0, entry(10))
    twin.put(1, entry(11))
    assert_same(twin.get(0), entry(0))
    assert_same(store.get(1), entry(1))
    assert twin.resident_nbytes() <= ENTRY_BYTES


def test_under_sharding_a_rank_reads_and_writes_only_its_own_clients(tmp_path):
    store = ClientStore()
    for cid in range(4):
        store.put(cid, entry(cid))
    store.bind(budget=None, owns=lambda c: c % 2 == 1)
    assert store.ids() == [1, 3]
    with pytest.raises(RuntimeError, match="Client 2's state is kept by another process"):
        store.put(2, entry(2))
    with pytest.raises(RuntimeError, match="Client 0's state is kept by another process"):
        store.get(0)
    store.load_state_dict({"entries": {c: entry(c) for c in range(6)}})
    assert store.ids() == [1, 3, 5]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (123, 123), ("2GB", 2 * 10**9), ("512 MiB", 512 * 2**20), ("1.5gb", 1_500_000_000), ("64", 64), (None, None)],
)
def test_memory_budgets_parse(value, expected):
    assert parse_memory(value) == expected


def test_auto_is_a_quarter_of_the_machine():
    assert parse_memory("auto") == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4


@pytest.mark.parametrize("value", [-1, "2 parsecs", "GB", True, 1.5, "-3MB"])
def test_a_bad_budget_is_one_error_naming_it(value):
    with pytest.raises(
        ValueError, match=rf"`client_state_memory` must be .* got {value!r}\.$".replace("(", r"\(").replace(")", r"\)")
    ):
        parse_memory(value)


@pytest.mark.parametrize("make", [lambda p: torch.optim.Adam(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)])
def test_optimizer_states_survive_the_store_and_continue_identically(tmp_path, make):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    optimizer = make(net.parameters())
    for _ in range(2):
        net(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    store = ClientStore()
    store.bind(budget=0, folder=tmp_path)  # through the disk
    store.put(0, flatten_optimizer_states([optimizer_state_to_cpu(optimizer)]))
    twin_net = copy.deepcopy(net)
    twin = make(twin_net.parameters())
    load_optimizer_state(twin, unflatten_optimizer_states(store.get(0))[0])
    x = torch.randn(8, 4)
    for n, o in ((net, optimizer), (twin_net, twin)):
        n(x).pow(2).mean().backward()
        o.step()
    for a, b in zip(net.parameters(), twin_net.parameters()):
        assert torch.equal(a, b)


def test_python_numbers_in_optimizer_state_round_trip():
    states = [{0: {"step": 3, "lr": 0.5, "flag": True, "skip": None}}, {}]
    assert unflatten_optimizer_states(flatten_optimizer_states(states)) == [{0: {"step": 3, "lr": 0.5, "flag": True}}, {}]


def test_the_loop_finds_an_algorithms_stores_and_those_it_wraps():
    from fl_lightning import DPFedAvg
    from tests.algorithms.stateful import RunningMeanFedAvg

    inner = RunningMeanFedAvg()
    assert inner.client_stores() == {"sums": inner.sums}
    wrapped = DPFedAvg(noise_multiplier=0.5, clip_norm=1.0, algorithm=inner)
    assert list(wrapped.client_stores()) == ["inner.sums"] and wrapped.client_stores()["inner.sums"] is inner.sums


def test_the_trainer_refuses_a_bad_budget_with_one_error():
    from fl_lightning import FederatedTrainer

    with pytest.raises(ValueError, match=r"`client_state_memory` must be .* got '12 parsecs'\.$"):
        FederatedTrainer(client_state_memory="12 parsecs", logger=False)


def test_a_budget_for_an_algorithm_without_client_state_warns_once_naming_it():
    from fl_lightning import FedAvg, FederatedTrainer
    from tests.algorithms.stateful import RunningMeanFedAvg

    with pytest.warns(
        UserWarning, match=r"`client_state_memory='2GB'` has no effect: FedAvg keeps no per-client state"
    ) as caught:
        FederatedTrainer(algorithm=FedAvg(), client_state_memory="2GB", logger=False)
    assert len([w for w in caught if "client_state_memory" in str(w.message)]) == 1
    FederatedTrainer(algorithm=RunningMeanFedAvg(), client_state_memory="2GB", logger=False)  # no warning: it has state


@pytest.mark.parametrize("outcome", ["finite", "non-finite", "raises"])
def test_a_rolled_back_aggregation_restores_only_the_entries_it_changed(tmp_path, outcome):
    from fl_lightning.loops.guards import aggregate_or_roll_back
    from tests.algorithms.stateful import RunningMeanFedAvg

    def never(entries):
        raise AssertionError("the roll-back point must not gather (nor copy) every client's entries")

    def live(values: torch.Tensor) -> bool:
        return any(
            type(o) is torch.Tensor and o is not values and o.shape == values.shape and torch.equal(o, values)
            for o in gc.get_objects()
        )

    algorithm = RunningMeanFedAvg()
    store = algorithm.sums
    for cid in range(4):
        store.put(cid, entry(cid))
    store.bind(budget=2 * ENTRY_BYTES, folder=tmp_path, gather=never)  # 0 and 1 spilled
    global_state = {"w": torch.zeros(3)}

    def aggregate() -> dict[str, float]:
        store.put(0, entry(10))  # a spilled entry changed
        store.put(3, entry(13))  # one in memory
        store.put(7, entry(17))  # a new client
        # Under a budget the entries kept for the undo wait in the spill file, not in memory.
        gc.collect()
        assert not live(entry(0)["w"]) and not live(entry(3)["w"])
        global_state["w"].fill_(float("nan") if outcome == "non-finite" else 1.0)
        if outcome == "raises":
            raise KeyboardInterrupt
        return {}

    if outcome == "raises":
        with pytest.raises(KeyboardInterrupt):
            aggregate_or_roll_back(0, algorithm, global_state, aggregate)
        assert torch.equal(global_state["w"], torch.zeros(3))
    else:
        _, rolled_back = aggregate_or_roll_back(0, algorithm, global_state, aggregate)
        assert rolled_back == (outcome == "non-finite")
    expected = {0: 10, 1: 1, 2: 2, 3: 13, 7: 17} if outcome == "finite" else {0: 0, 1: 1, 2: 2, 3: 3}
    assert store.ids() == sorted(expected)
    for cid, source in expected.items():
        assert_same(store.get(cid), entry(source))
    assert store._arena is not None and all(key >= 0 for key in store._arena._layouts)  # nothing left set aside
