"""Where each stage runs and the exact torchrun command line every host gets.

The same argument lists go to local and SSH hosts; only the transport differs.
Static rendezvous (torchrun's default) is named explicitly: under c10d the node
order would be a string sort of addresses and --node-rank would be ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pictl.errors import ConfigError, TransportError
from pictl.inventory import Cluster, Host
from pictl.transport import Transport
from remote import protocol as P

# Binds the port in argv[1] (0: any free one) on the rendezvous host and prints it, or the
# reason it is taken. Fixed code: the port travels as an argument, never inside the code.
_PORT_SNIPPET = ("import socket, sys\ns = socket.socket()\ntry:\n    s.bind(('', int(sys.argv[1])))\n"
                 "except OSError as e:\n    sys.exit(e.strerror)\nprint(s.getsockname()[1])\ns.close()\n")


@dataclass(frozen=True)
class NodePlan:
    """One torchrun agent: a host and the consecutive stages (ranks) it runs."""

    host: Host
    node_rank: int
    first_rank: int
    nproc: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


def place_stages(cluster: Cluster, stages: int) -> list[NodePlan]:
    """Stages in order over hosts in order: one per host while they last, then up to each host's slots.

    Adjacent stages share a host, so an extra hop stays local.
    """
    if stages > cluster.slots:
        raise ConfigError(f"{stages} stages do not fit {cluster.source}: {len(cluster.hosts)} hosts with "
                          f"{cluster.slots} stage slot(s) in all (raise a host's `slots` to run more)")
    counts = [0] * len(cluster.hosts)
    remaining = stages
    while remaining:  # round-robin one extra stage per host, never past its slots
        for i, host in enumerate(cluster.hosts):
            if remaining and counts[i] < host.slots:
                counts[i] += 1
                remaining -= 1
    nodes: list[NodePlan] = []
    rank = 0
    for host, n in zip(cluster.hosts, counts, strict=True):
        if n:
            nodes.append(NodePlan(host, len(nodes), rank, n))
            rank += n
    return nodes


def worker_env(host: Host, threads: int) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(threads), P.ENV_THREADS: str(threads), "PYTHONPATH": host.code_dir,
           "PYTHONUNBUFFERED": "1"}
    if host.interface:
        # Gloo otherwise binds to whatever the hostname resolves to (127.0.1.1 on Pi OS).
        env["GLOO_SOCKET_IFNAME"] = host.interface
    return env


def torchrun_argv(node: NodePlan, *, nnodes: int, master: Host, master_port: int, spec_path: str) -> list[str]:
    return [
        node.host.python_path(), "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={node.nproc}", f"--node-rank={node.node_rank}",
        "--rdzv-backend=static", f"--master-addr={master.rendezvous_address}",
        f"--master-port={master_port}", "--max-restarts=0",
        "-m", "remote.pipeline", "--spec", spec_path,
    ]


def module_argv(host: Host, module: str, spec_path: str) -> list[str]:
    return [host.python_path(), "-m", module, "--spec", spec_path]


def supervised(host: Host, argv: list[str], pgid_file: str) -> list[str]:
    """Wrap a long-running command so it dies with the controller's pipe or connection.

    `remote.supervise` records the command's process group in `pgid_file` (relative to
    the run directory) for `pictl stop`, and stops the group when its stdin closes.
    """
    return [host.python_path(), "-m", "remote.supervise", "--pgid-file", pgid_file, "--", *argv]


async def master_port(transport: Transport, wanted: int | None) -> int:
    """`wanted` if it is free on the rendezvous host (ConfigError if not), else a port the OS says is free.

    Other users share the Pis: a fixed port may be taken, so by default none is fixed.
    """
    h = transport.host
    result = await transport.run([h.base_python(), "-c", _PORT_SNIPPET, str(wanted or 0)], timeout_s=30)
    if result.returncode == 0 and result.stdout.strip().isdigit():
        return int(result.stdout.strip())
    reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
    if wanted:
        raise ConfigError(f"master_port: {wanted} is not free on host '{h.name}' ({reason}); choose another "
                          "or leave it unset to use a free one")
    raise TransportError(f"host '{h.name}': cannot find a free port: {reason}")


def cleanup_argv(host: Host, *, orphans_only: bool) -> list[str]:
    argv = [host.base_python(), "-m", "remote.cleanup", "--workdir", host.workdir]
    return [*argv, "--orphans-only"] if orphans_only else argv


async def cleanup_host(transport: Transport, *, orphans_only: bool) -> dict:
    """Stop what earlier runs left on the host; {"stopped": [...], "kept": [...], "stale": n}."""
    host = transport.host
    result = await transport.run(cleanup_argv(host, orphans_only=orphans_only),
                                 env={"PYTHONPATH": host.code_dir}, timeout_s=60)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TransportError(f"host '{host.name}': cleanup failed: {result.stderr.strip()[-300:]}") from None
