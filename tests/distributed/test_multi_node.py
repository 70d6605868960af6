"""Two nodes × one process on localhost give the global weights of one process (issue 15, item 8).

Each "node" is a ``torchrun --nnodes 2 --node-rank n`` launch of ``ddp_run.py --num-nodes 2``,
exactly as on two machines (static rendezvous at ``127.0.0.1`` on a free port, gloo). The
process group's 600 s timeout and the launch deadline make a hang fail instead of waiting.
"""

from __future__ import annotations

import sys

from tests.distributed.ddp_run import fit
from tests.distributed.launch import free_port, run_together
from tests.waiting import CEILING
from tests.distributed.test_ddp_equivalence import SCRIPT, TOLERANCE, max_diff, result


def torchrun(node_rank: int, port: int, *script_args: str) -> list[str]:
    """The command one node runs: ``torchrun`` with one process on this node, two nodes in all."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), str(SCRIPT), *script_args,
    ]  # fmt: skip


def test_two_nodes_match_one_process(tmp_path):
    # 5 clients per round over 2 ranks: an uneven 3/2 split across the nodes.
    port, out = free_port(), tmp_path / "two_nodes"
    run_together([torchrun(node, port, "--num-nodes", "2", "--out", str(out)) for node in (0, 1)], timeout=CEILING)
    fit(tmp_path / "one")
    one, rank0, rank1 = result(tmp_path / "one"), result(out, 0), result(out, 1)

    assert rank0["history"] == rank1["history"] == one["history"]
    assert max_diff(rank0["global_state"], rank1["global_state"]) == 0.0
    assert max_diff(one["global_state"], rank0["global_state"]) <= TOLERANCE
