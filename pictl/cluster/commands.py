"""The commands pictl runs on a host, as argument lists: `remote/` modules under the supervisor, the
environment they get, the rendezvous-port check, and the cleanup of what earlier runs left.

The same argument lists go to local and SSH hosts; only the transport differs.
"""

from __future__ import annotations

import json

from pictl.cluster.transport import Transport
from pictl.errors import ConfigError, NotReady, TransportError
from pictl.inventory import Host
from pictl.text import ascii_count
from remote.floor import entries
from remote.floor import protocol as P

# Binds the port in argv[1] (0: any free one) on the rendezvous host and prints it, or the
# reason it is taken. Fixed code: the port travels as an argument, never inside the code.
_PORT_SNIPPET = ("import socket, sys\ns = socket.socket()\ntry:\n    s.bind(('', int(sys.argv[1])))\n"
                 "except OSError as e:\n    sys.exit(e.strerror)\nprint(s.getsockname()[1])\ns.close()\n")
PORT_TAKEN = "EADDRINUSE"
"""In torchrun's output when its rendezvous store could not bind the master port (taken since we chose it)."""
PORT_ATTEMPTS = 3


WARM_CLIENT = entries.WARM_CLIENT.module


def worker_env(host: Host, threads: int) -> dict[str, str]:
    from pictl.cluster.leases import controller_name

    # (the owner: whose job a warm process runs, so that `pictl stop` ends this controller's jobs only)
    env = {"OMP_NUM_THREADS": str(threads), P.ENV_THREADS: str(threads), "PYTHONPATH": host.code_dir,
           "PYTHONUNBUFFERED": "1", "PICTL_WARM_IDLE": f"{host.warm_idle_s:g}", P.ENV_OWNER: controller_name()}
    if host.interface:
        # Gloo otherwise binds to whatever the hostname resolves to (127.0.1.1 on Pi OS).
        env["GLOO_SOCKET_IFNAME"] = host.interface
    return env


def python_module(host: Host, module: str, *args: str) -> list[str]:
    """`python -m MODULE ARGS` on the host: forked from its warm process (`remote.host.warm`: no torch import
    on the way) unless the host is cold (`warm = false`, `--cold`)."""
    if host.warm:
        return [host.python_path(), "-m", WARM_CLIENT, module, *args]
    return [host.python_path(), "-m", module, *args]


def module_argv(host: Host, module: str, spec_path: str) -> list[str]:
    return python_module(host, module, "--spec", spec_path)


def supervised(host: Host, argv: list[str], pgid_file: str) -> list[str]:
    """Wrap a long-running command so it dies with the controller's pipe or connection.

    `remote.host.supervise` records the command's process group in `pgid_file` (relative to
    the run directory) for `pictl stop`, and stops the group when its stdin closes.
    """
    return [host.python_path(), "-m", entries.SUPERVISE.module, "--pgid-file", pgid_file, "--", *argv]


async def master_port(transport: Transport, wanted: int | None) -> int:
    """`wanted` if it is free on the rendezvous host (ConfigError if not), else a port the OS says is free.

    Other users share the Pis: a fixed port may be taken, so by default none is fixed.
    """
    h = transport.host
    result = await transport.run([h.base_python(), "-c", _PORT_SNIPPET, str(wanted or 0)], timeout_s=30)
    port = ascii_count(result.stdout, most=65535) if result.returncode == 0 else None
    if port:
        return port
    reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
    if wanted:
        raise ConfigError(f"master_port: {wanted} is not free on host '{h.name}' ({reason}); choose another "
                          "or leave it unset to use a free one")
    raise TransportError(f"host '{h.name}': cannot find a free port: {reason}")


def cleanup_argv(host: Host, *, orphans_only: bool, owner: str | None = None, keep: str | None = None,
                 finish: str | None = None) -> list[str]:
    argv = [host.base_python(), "-m", entries.CLEANUP.module, "--workdir", host.workdir]
    if orphans_only:
        argv.append("--orphans-only")
    for flag, value in (("--owner", owner), ("--keep", keep), ("--finish", finish)):
        if value is not None:
            argv += [flag, value]
    return argv


async def cleanup_host(transport: Transport, *, orphans_only: bool, owner: str | None = None,
                       keep: str | None = None, finish: str | None = None) -> dict:
    """Stop what earlier runs left on the host (see `remote.host.cleanup`):
    {"stopped": [...], "kept": [...], "stale": n, "removed": [...]}."""
    host = transport.host
    result = await transport.run(cleanup_argv(host, orphans_only=orphans_only, owner=owner, keep=keep,
                                              finish=finish), env={"PYTHONPATH": host.code_dir}, timeout_s=60)
    try:
        swept = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TransportError(f"host '{host.name}': cleanup failed: {result.stderr.strip()[-300:]}") from None
    if isinstance(swept, dict) and isinstance(swept.get("error"), str):  # its runs directory is a link
        raise NotReady(f"host '{host.name}': {swept['error']}")
    return swept
