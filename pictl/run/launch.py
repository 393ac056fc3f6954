"""The exact torchrun command line every host gets.

Static rendezvous (torchrun's default) is named explicitly: under c10d the node
order would be a string sort of addresses and --node-rank would be ignored.
"""

from __future__ import annotations

from pictl.inventory import Host
from pictl.planning.placement import NodePlan


def torchrun_argv(node: NodePlan, *, nnodes: int, master: Host, master_port: int, spec_path: str,
                  run_id: str = "none", module: str = "remote.runtime.pipeline") -> list[str]:
    # --rdzv-id: the static rendezvous keys its store by it, so agents of another run that reach our
    # port (a shared Pi) never mix with ours.
    return [
        node.host.python_path(), "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={node.nproc}", f"--node-rank={node.node_rank}",
        "--rdzv-backend=static", f"--rdzv-id={run_id}", f"--master-addr={master.rendezvous_address}",
        f"--master-port={master_port}", "--max-restarts=0",
        "-m", module, "--spec", spec_path,
    ]
