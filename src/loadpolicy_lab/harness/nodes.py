"""One torchrun agent per rank, as on separate nodes: no launcher stops the other ranks when one of them dies.

Under a single torchrun the agent SIGTERMs every rank as soon as one fails, which hides what the survivors do; on a
multi-node job each node's agent watches only its own ranks, and the others go on into their next collective (under
NCCL they wait there until the process group's timeout). `python -m loadpolicy_lab.harness.nodes RANKS PORT WORKER...`
starts RANKS agents of one rank each with a static rendezvous on 127.0.0.1:PORT (node 0's agent hosts the store),
waits for every one, and exits with the first non-zero exit code.
"""

from __future__ import annotations

import subprocess
import sys


def node_command(ranks: int, node: int, port: int, worker: list[str]) -> list[str]:
    """The torchrun line of node `node` of `ranks`, one rank per node."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={ranks}",
        f"--node-rank={node}",
        "--nproc-per-node=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        *worker,
    ]


def main(argv: list[str]) -> int:
    ranks, port, worker = int(argv[0]), int(argv[1]), argv[2:]
    agents = [subprocess.Popen(node_command(ranks, node, port, worker)) for node in range(ranks)]
    codes = [agent.wait() for agent in agents]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
