"""hosts.toml -> a typed, validated Cluster.

    [defaults]            # optional: values every [[host]] starts from
    transport = "ssh"

    [[host]]
    name = "pi1"
    address = "pi1.example.org"
    ...

Errors name the file and the field (`hosts.toml: host[2].port: ...`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pictl.errors import ConfigError
from pictl.text import shown
from pictl.validation import Namer, problem_line

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_INTERFACE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$"
"""A Linux interface name: at most 15 characters, no `/` or spaces (gloo and the probe use it as given)."""
RESERVED_NAMES = frozenset({"serial"})
"""Names a host cannot take: the serial baseline's records use them (`events/serial.jsonl`)."""
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
"""One label of a host name: ASCII letters, digits and inner '-' (and '_', which ~/.ssh/config aliases such
as `lab_h1` use), at most 63 characters. Nothing else: `a,*` is a known_hosts pattern, `-o...` an option."""


_CPU_LIST = re.compile(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*")


def parse_cpu_list(text: str) -> frozenset[int]:
    """A cpuset list as taskset and /sys write it ("0-3", "4,5", "0-1,6") -> its cores; ValueError naming it."""
    if not isinstance(text, str) or not _CPU_LIST.fullmatch(text.replace(" ", "")):
        raise ValueError(f"{shown(repr(text), 40)} is not a list of cores such as \"0-3\", \"4,5\" or \"0-1,6\"")
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        first, _, last = part.partition("-")
        if last and int(last) < int(first):
            raise ValueError(f"{part!r} counts down (write \"{last}-{first}\")")
        cores.update(range(int(first), int(last or first) + 1))
    return frozenset(cores)


def cpu_list_text(cores: frozenset[int] | set[int]) -> str:
    """Cores as a cpuset list: {0, 1, 2, 3, 6} -> "0-3,6"."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def address_problem(address: str) -> str | None:
    """Why `address` is not a host name (or ~/.ssh/config alias), an IPv4 or an IPv6 address; None when it is
    one. `pictl init` asks this too, so it never writes an inventory that pictl would refuse."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        pass
    else:  # an IPv6 zone is an interface name (fe80::1%eth0); ipaddress takes any text there
        zone = getattr(ip, "scope_id", None)
        if zone is None or re.fullmatch(_INTERFACE_PATTERN, zone):
            return None
        return f"{shown(address, 80)!r}: {shown(zone, 40)!r} is not an interface name"
    if address.startswith("[") and address.endswith("]"):
        return f"{shown(address, 80)!r}: give an IPv6 address without brackets"
    name = address.removesuffix(".")  # a fully qualified name may end in a dot
    if len(name) > 253:
        return f"a host name of {len(address)} characters (at most 253)"
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return (f"{shown(address, 80)!r} is not a host name (dot-separated labels of ASCII letters, digits and "
                f"'-'), nor an IPv4 or IPv6 address")
    if all(label.isdigit() for label in labels):
        return f"{address!r} is not an IPv4 address"
    return None


class Host(BaseModel):
    """One machine of the cluster."""

    # strict: TOML has real types, so `port = "22"` or `slots = true` is a mistake to name, not to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=_NAME_PATTERN, max_length=64)
    """Short name used in logs, run records and trace files."""
    transport: Literal["local", "ssh"] = "ssh"
    """`local` runs on this machine (the shipped demo cluster); `ssh` reaches the host over SSH."""
    address: str = "127.0.0.1"
    """Where the controller connects: a hostname, an IP, or an alias from ~/.ssh/config."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """SSH port (the course's Pis sit behind one public address, a port each); default: ssh config, else 22."""
    user: str | None = None
    """SSH user; default from ~/.ssh/config or the local user."""
    key: str | None = None
    """Private key file for SSH; default: ~/.ssh/config, the agent, the usual key files."""
    known_hosts: str | None = None
    """known_hosts file that verifies this host's key; default: ~/.ssh/known_hosts."""
    lan_address: str | None = None
    """Address the other hosts use to reach this one (the rendezvous); default: `address`."""
    interface: str | None = Field(default=None, pattern=_INTERFACE_PATTERN)
    """Network interface gloo binds to (GLOO_SOCKET_IFNAME), e.g. eth0. Required for real Pis."""
    workdir: str = "~/pictl"
    """Directory on the host that pictl owns: code, specs, run outputs."""
    venv: str | None = None
    """Virtual environment on the host; `None` on a local host means the controller's own Python."""
    python: str = "python3"
    """Interpreter used to create the venv (>= 3.11)."""
    system_site_packages: bool = False
    """Let the venv see the host's own packages (torch from apt or a prepared lab image); installs with pip."""
    rank: int | None = Field(default=None, ge=0)
    """Position in the pipeline (0 runs the first stage); default: the order of [[host]] entries."""
    slots: int = Field(default=1, ge=1, le=64)
    """How many stage processes this host may run at once."""
    warm: bool = True
    """Serve jobs from a warm process (torch imported once, jobs forked: `remote.host.warm`); false: every job
    starts a fresh interpreter (a host with too little memory, or to compare). `pictl run --cold` for one run."""
    warm_idle_s: float = Field(default=600.0, gt=0, le=7 * 86400)
    """The warm process ends after this many seconds without a job."""
    keepalive_s: float = Field(default=5.0, ge=0.5, le=600)
    """SSH keepalives this many seconds apart; a host that answers none of 3 in a row is gone (its run's rank is
    lost: `pictl run --on-host-loss`). Shorter on a wired lab, longer on flaky Wi-Fi."""
    cpus: str | None = None
    """A local host's cores, as taskset takes them ("0-3", "4,5", "0-1,6"): every process pictl starts for the
    host is pinned to them, so hosts on one workstation each have cores of their own. Default: not pinned."""

    @field_validator("address", "lan_address")
    @classmethod
    def _an_address(cls, address: str | None) -> str | None:
        problem = None if address is None else address_problem(address)
        if problem:
            raise ValueError(problem)
        return address

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.lower() in RESERVED_NAMES:
            raise ValueError(f"'{name}' is reserved (the serial baseline's records use it); choose another name")
        return name

    @field_validator("cpus")
    @classmethod
    def _cores_here(cls, cpus: str | None, info: ValidationInfo) -> str | None:
        """Cores this machine has and pictl may use: a local host runs here (an SSH host's cores are its own)."""
        if cpus is None:
            return None
        who = f"host '{info.data['name']}'" if "name" in info.data else "this host"
        if info.data.get("transport") != "local":
            raise ValueError(f"{who} is not local (transport = \"local\"): only this machine's cores can be pinned")
        wanted, usable = parse_cpu_list(cpus), os.sched_getaffinity(0)
        if missing := sorted(wanted - usable):
            core = f"cores {cpu_list_text(set(missing))} are" if len(missing) > 1 else f"core {missing[0]} is"
            raise ValueError(f"{who}: {core} not on this machine (pictl may use cores {cpu_list_text(usable)})")
        return cpus

    @property
    def cpu_set(self) -> frozenset[int] | None:
        """The cores this host's processes are pinned to (None: not pinned)."""
        return parse_cpu_list(self.cpus) if self.cpus else None

    @property
    def rendezvous_address(self) -> str:
        return self.lan_address or self.address

    def python_path(self) -> str:
        """The interpreter that runs `remote/` on this host."""
        if self.venv:
            return f"{self.venv.rstrip('/')}/bin/python"
        if self.transport == "local":
            return sys.executable
        return self.python

    def venv_path(self) -> str:
        """The environment `remote/` runs in (a local host without one uses the controller's)."""
        return self.venv or (sys.prefix if self.transport == "local" else f"{self.workdir.rstrip('/')}/venv")

    def base_python(self) -> str:
        """An interpreter that exists before any venv: for pictl's stdlib-only helpers."""
        if self.transport == "local" and "python" not in self.model_fields_set:
            return sys.executable  # the demo cluster runs on the controller's own interpreter
        return self.python

    @property
    def code_dir(self) -> str:
        return f"{self.workdir.rstrip('/')}/code"

    def run_dir(self, run_id: str) -> str:
        return f"{self.workdir.rstrip('/')}/runs/{run_id}"


class Cluster(BaseModel):
    """All hosts, in stage order: stage 0 runs on the first host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "cluster"
    hosts: tuple[Host, ...]
    baseline_max_age: float | None = Field(default=None, gt=0)
    """Seconds a cached serial baseline may be reused for (`[cluster]`; a run's own setting wins)."""
    track: tuple[Literal["tensorboard", "wandb"], ...] = ()
    """Trackers every run, sweep and training job writes to (`[cluster] track`), unless it names its own."""
    source: str = ""
    """The file this was read from (for messages)."""

    @model_validator(mode="after")
    def _unique_names(self) -> Cluster:
        seen: set[str] = set()
        for i, host in enumerate(self.hosts):
            if host.name in seen:
                raise ValueError(f"host[{i}].name: '{host.name}' is used twice")
            seen.add(host.name)
        return self

    @model_validator(mode="after")
    def _order_by_rank(self) -> Cluster:
        ranked = [i for i, h in enumerate(self.hosts) if h.rank is not None]
        if not ranked:
            return self
        if len(ranked) != len(self.hosts):
            missing = next(i for i, h in enumerate(self.hosts) if h.rank is None)
            raise ValueError(f"host[{missing}].rank: missing (give every host a rank, or none)")
        seen: dict[int, int] = {}
        for i, host in enumerate(self.hosts):
            assert host.rank is not None  # every host has one (checked above)
            if host.rank >= len(self.hosts) or host.rank in seen:
                what = "is used twice" if host.rank in seen else f"is out of range (0..{len(self.hosts) - 1})"
                raise ValueError(f"host[{i}].rank: {host.rank} {what}")
            seen[host.rank] = i
        # Frozen model: set the field once, here, to the stage order the ranks give.
        object.__setattr__(self, "hosts", tuple(sorted(self.hosts, key=lambda h: h.rank)))
        return self

    @field_validator("hosts")
    @classmethod
    def _not_empty(cls, hosts: tuple[Host, ...]) -> tuple[Host, ...]:
        if not hosts:
            raise ValueError("no [[host]] entries")
        return hosts

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(f"{self.source}: no host named '{name}'")

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)


def format_validation_error(source: str, exc: ValidationError, model: Any = None, *,
                            name_of: Namer = str) -> str:
    """The first problem pydantic found, in pictl's words (`pictl.validation`): `SOURCE: FIELD: PROBLEM`. `model`
    (the model checked) lets a bound be said whole; `name_of` names a top-level field as the caller does."""
    return problem_line(exc, model, name_of=name_of, source=source)


def read_toml(path: Path, what: str) -> dict:
    """A TOML file as a dict, or ConfigError naming the file: missing, unreadable, not UTF-8, not TOML."""
    try:
        found = path.is_file()
    except OSError as exc:  # a name over 255 bytes, a path over 4096: bad input, not a crash
        raise ConfigError(f"{shown(path)}: cannot read the {what} ({exc.strerror or exc})") from None
    if not found:
        raise ConfigError(f"{path}: {what} not found")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None


def _tracked(path: Path, value: object) -> tuple[str, ...]:
    """`[cluster] track`: one tracker's name or a list of them, each one pictl knows."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(n in ("tensorboard", "wandb") for n in names):
        raise ConfigError(f"{path}: cluster.track: a list of tensorboard, wandb (got {value!r:.60})")
    return tuple(names)


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate an inventory, or raise ConfigError naming the file and field."""
    path = Path(path)
    raw = read_toml(path, "inventory file")
    unknown = set(raw) - {"cluster", "defaults", "host"}
    if unknown:
        raise ConfigError(f"{path}: unknown section {sorted(unknown)[0]!r} (expected [cluster], [defaults], [[host]])")
    for section in ("cluster", "defaults"):
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(f"{path}: '{section}' must be a table ([{section}]), not a "
                              f"{type(raw[section]).__name__}")
    defaults = raw.get("defaults", {})
    hosts = raw.get("host", [])
    if not isinstance(hosts, list):
        raise ConfigError(f"{path}: 'host' must be an array of tables ([[host]])")
    for i, h in enumerate(hosts):
        if not isinstance(h, dict):
            raise ConfigError(f"{path}: host[{i}] must be a table ([[host]]), not a {type(h).__name__}")
    table = raw.get("cluster", {})
    cluster_wide = {"warm": table["warm"]} if "warm" in table else {}  # ([cluster] warm = false: every host)
    merged = [{**cluster_wide, **defaults, **h} for h in hosts]
    for key, value in table.items():
        if key not in ("name", "baseline_max_age", "warm", "track"):
            raise ConfigError(f"{path}: cluster.{key!r}: unknown field (name, baseline_max_age, warm, track)")
        if key == "warm" and not isinstance(value, bool):
            raise ConfigError(f"{path}: cluster.warm: must be true or false, not a {type(value).__name__}")
        if key == "name" and not isinstance(value, str):
            raise ConfigError(f"{path}: cluster.name: must be a string, not a {type(value).__name__}")
        if key == "baseline_max_age" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{path}: cluster.baseline_max_age: must be a number of seconds, not a "
                              f"{type(value).__name__}")
    try:
        return Cluster.model_validate({"name": table.get("name", path.stem), "hosts": merged, "source": str(path),
                                       "baseline_max_age": table.get("baseline_max_age"),
                                       "track": _tracked(path, table.get("track", ()))})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc, Cluster,
                                                  name_of=lambda f: "host" if f == "hosts" else f)) from exc
