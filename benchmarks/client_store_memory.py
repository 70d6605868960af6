"""Peak memory of per-client state from 100 to 10,000 clients: flat beyond the store's budget?

Each configuration runs in a fresh subprocess: a :class:`~fl_lightning.server.client_store.ClientStore` bound to
a memory budget (``--budget``, default 1GB) and a spill folder (``--folder``, default the system's temporary
folder) receives one state of ``--params`` float32 parameters (default 1 M: 4 MB) for each of N clients, then runs
``--rounds`` rounds in which ``--per-round`` clients drawn uniformly read their state and write a new one, as a
stateful algorithm does (SCAFFOLD's control variates, FedSoft's personalised models). The store is measured
directly, not through training, so the population's size is the only thing that changes.

Measured per configuration: peak RSS (``ru_maxrss``) and its growth over the RSS before the store (torch
imported), the bytes of entries in memory and on disk (the spill folder's files), the seconds to fill the
store and the mean seconds per round. The claim checked: the peak stays within the budget plus one round's
working set, whatever N. The spill files are deleted with their store (at the end of each subprocess).

glibc's default malloc raises its mmap threshold as large blocks are freed, after which 4 MB entries come from
the heap and freed ones stay resident; the store calls ``malloc_trim`` when it spills, which returns them (before
it did, the growth measured 2 to 2.7 times the budget). ``--malloc-mmap-threshold`` fixes the threshold instead.

Run from the repository root (the 10,000-client row writes 40 GB; it takes minutes on an idle disk)::

    PYTHONPATH=. python benchmarks/client_store_memory.py --out benchmarks/results/client_store.md
    PYTHONPATH=. python benchmarks/client_store_memory.py --malloc-mmap-threshold 1048576 --unbounded "" --out ...
    PYTHONPATH=. python benchmarks/client_store_memory.py --clients 100,1000 --budget 256MB   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from reporting import emit, header, load  # benchmarks/ is on sys.path when run as a script

MIB = 2**20


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_parts() -> tuple[int, int]:
    """Anonymous and file-backed resident bytes (``RssAnon``, ``RssFile``): file-backed pages (a memory-mapped spill
    file being read) are clean page cache that the kernel reclaims under pressure; anonymous ones are not."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value, _ = line.split()
                parts[key] = int(value) * 1024
    return parts["RssAnon:"], parts["RssFile:"]


def measure_save(store: Any, how: str, folder: str | None) -> dict[str, float]:
    """Peak RSS growth, anonymous and file-backed (sampled every 2 ms), and seconds of one checkpoint of the store's
    entries: ``streamed`` by :func:`~fl_lightning.checkpointing.checkpoint_io.atomic_save`, or ``buffered`` as it was
    before issue 39 item 1 (serialised into an ``io.BytesIO``, then written)."""
    import io
    import tempfile
    import threading

    import torch

    from fl_lightning.checkpointing.checkpoint_io import atomic_save

    path = os.path.join(tempfile.mkdtemp(dir=folder), "round.ckpt")
    before, peak, done = rss_parts(), [0, 0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[:] = [max(p, now) for p, now in zip(peak, rss_parts())]
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    if how == "streamed":
        atomic_save({"entries": store.state_dict()}, path)
    else:
        buffer = io.BytesIO()
        torch.save({"entries": store.state_dict()}, buffer)
        with open(path, "wb") as f:
            f.write(buffer.getbuffer())
            os.fsync(f.fileno())
        del buffer
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    size = os.path.getsize(path)
    os.remove(path)
    os.rmdir(os.path.dirname(path))
    return {"anon": max(peak[0] - before[0], 0), "file": max(peak[1] - before[1], 0), "seconds": seconds, "bytes": size}


def measure(
    clients: int, budget: str, params: int, rounds: int, per_round: int, folder: str | None, save: str = ""
) -> dict[str, Any]:
    """One configuration, in this process."""
    import torch

    from fl_lightning.server.client_store import ClientStore
    from fl_lightning.server.memory_budget import parse_memory

    torch.set_num_threads(1)
    base = torch.randn(params, generator=torch.Generator().manual_seed(0))
    before = current_rss()
    store = ClientStore()
    store.bind(budget=None if budget == "none" else parse_memory(budget), folder=folder)
    started = time.perf_counter()
    for cid in range(clients):
        store.put(cid, {"w": base + cid})
    fill_s = time.perf_counter() - started
    generator = torch.Generator().manual_seed(1)
    round_s = []
    for _ in range(rounds):
        started = time.perf_counter()
        for cid in torch.randperm(clients, generator=generator)[:per_round].tolist():
            state = store.get(cid)
            store.put(cid, {"w": state["w"] + 1.0})  # the client's new state
        round_s.append(time.perf_counter() - started)
    spill = store.spill_folder
    disk = sum(e.stat().st_size for e in os.scandir(spill)) if spill else 0
    saves = {how: measure_save(store, how, folder) for how in save.split(",") if how}
    return {
        **saves,
        "clients": clients,
        "budget": budget,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "before": before,
        "resident": store.resident_nbytes(),
        "total": store.nbytes(),
        "disk": disk,
        "fill_s": fill_s,
        "round_s": sum(round_s) / max(1, len(round_s)),
    }


def run_child(args: argparse.Namespace, clients: int, budget: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(clients), "--budget", budget, "--params", str(args.params),
           "--rounds", str(args.rounds), "--per-round", str(args.per_round)] + (["--folder", args.folder] if args.folder else []) + (["--save", args.save] if args.save else [])  # fmt: skip
    env = dict(os.environ)
    if args.malloc_mmap_threshold is not None:  # fixed: glibc then serves large blocks by mmap, unmapped on free
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rows: list[dict[str, Any]], args: argparse.Namespace, started: float, load_before: str) -> str:
    threshold = args.malloc_mmap_threshold or os.environ.get("MALLOC_MMAP_THRESHOLD_")
    lines = [
        "## Per-client state: peak memory from 100 to 10,000 clients (issue 28, item 5)",
        "",
        *header(started, load_before, threads=1),
        f"- one float32 state of {args.params:,} parameters ({args.params * 4 / MIB:.1f} MiB) per client; "
        f"{args.rounds} rounds of {args.per_round} clients reading and rewriting theirs",
        f"- glibc `MALLOC_MMAP_THRESHOLD_` in the children: {threshold or 'unset (the default, dynamic threshold)'}",
        "",
        "| clients | budget | state (MiB) | in memory (MiB) | on disk (MiB) | peak RSS (MiB) | growth over start (MiB) "
        "| fill (s) | s / round |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']:,} | {r['budget']} | {r['total'] / MIB:,.0f} | {r['resident'] / MIB:,.0f} | {r['disk'] / MIB:,.0f} "
            f"| {r['peak_rss'] / MIB:,.0f} | {(r['peak_rss'] - r['before']) / MIB:,.0f} | {r['fill_s']:.1f} | {r['round_s']:.2f} |"
        )
    saved = [r for r in rows if "streamed" in r]
    if saved:
        lines += [
            "",
            "Checkpointing the store's entries (every entry inline), streamed to the file as `atomic_save` does now, "
            "and serialised into memory first as before (issue 39 item 1):",
            "",
            "Growth of the resident memory during the save, anonymous (not reclaimable) and file-backed (pages of the "
            "memory-mapped spill file as they are read: page cache, reclaimed under pressure):",
            "",
            "| clients | budget | checkpoint (MiB) | streamed: anon / file growth (MiB) | s | buffered: anon / file growth (MiB) | s |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in saved:
            st, bu = r["streamed"], r.get("buffered")
            buffered = f"{bu['anon'] / MIB:,.0f} / {bu['file'] / MIB:,.0f} | {bu['seconds']:.1f}" if bu else "not run | "
            lines.append(
                f"| {r['clients']:,} | {r['budget']} | {st['bytes'] / MIB:,.0f} | {st['anon'] / MIB:,.0f} / {st['file'] / MIB:,.0f} "
                f"| {st['seconds']:.1f} | {buffered} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="100,1000,3000,10000", help="comma-separated client counts")
    parser.add_argument("--budget", default="1GB", help="the store's memory budget (client_state_memory)")
    parser.add_argument("--unbounded", default="100", help="client counts also run without a budget (comma-separated)")
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--folder", default=None, help="where the spill folders are made")
    parser.add_argument(
        "--malloc-mmap-threshold", type=int, help="set glibc's MALLOC_MMAP_THRESHOLD_ (bytes) in the child processes"
    )
    parser.add_argument(
        "--save", nargs="?", const="streamed,buffered", default="", choices=["streamed", "buffered", "streamed,buffered"],
        help="also checkpoint the store, streamed and buffered (issue 39); 'streamed' alone where a buffered copy would not fit in memory",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.budget, args.params, args.rounds, args.per_round, args.folder, args.save)))
        return
    started, load_before = time.perf_counter(), load()
    rows = [run_child(args, int(n), "none") for n in args.unbounded.split(",") if n]
    for n in args.clients.split(","):
        rows.append(run_child(args, int(n), args.budget))
        print(rows[-1], file=sys.stderr, flush=True)
    emit(report(rows, args, started, load_before), args.out)


if __name__ == "__main__":
    main()
