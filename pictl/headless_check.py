"""`pictl check` on a terminal: one row per host, what it has, what keeps it busy now, and whether it is ready."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from pictl.cluster.check import InterfaceReport, PackageVersions, ReachReport, VenvReport
from pictl.console import Fitted
from pictl.summary_figures import Open
from pictl.summary_models import HostState
from pictl.text import figure, markup_safe

# What `pictl check` gathered of a host (`pictl.cluster.check.HostCheck`), read by field as it was gathered
# (`Open.view`: never coerced, so a cell shows the value the host reported). A default is what the table shows
# for a fact the host did not report: a host that could not be probed has an empty probe.


class VenvProbe(VenvReport):
    """The host's venv as the table shows it: a python the probe did not report is "missing"."""

    python: Any = "missing"


class HostProbe(HostState):
    """The probe's report of a host (`remote/host/probe.py`): its state's CPUs and heat, its python and venv,
    the interface hosts.toml names and whether it reached the rendezvous."""

    python: Any = "-"
    cpus: Any = "-"
    mem_available_mb: Any = "-"
    venv: Any = {}
    interface: Any = None
    rendezvous: Any = None


class HostLoad(Open):
    """What keeps the host busy now (`HostCheck.load`, from `pictl.cluster.monitor.load_now`)."""

    busy_cores: Any = None
    cpus: Any = None
    runnable: Any = None
    cpu_wait: Any = None
    power_w: Any = None
    power_source: Any = None


class WarmCell(Open):
    """The host's warm process (`HostCheck.warm`: `WarmState.as_dict`, or only an `error` where it was not asked)."""

    enabled: Any = None
    running: Any = None
    answering: Any = None
    error: Any = None
    pid: Any = None
    age_s: Any = 0
    rss_mb: Any = None


def _warm_cell(found: dict[str, Any] | None) -> str:
    warm = WarmCell.view(found)
    if not found or (warm.error and warm.answering is not False):
        return "-"
    if not warm.enabled:
        return "cold"
    if not warm.running:
        return "none"
    if warm.answering is False:
        return "[red]no answer[/]"
    return markup_safe(f"pid {warm.pid} {warm.age_s:.0f}s {warm.rss_mb}MB")


def _cpus_cell(probe: HostProbe) -> str:
    """The CPUs the host's processes may use: their count, the cores they are pinned to (`cpus` in hosts.toml,
    or a taskset), and a CFS quota that caps them below that."""
    cell = str(probe.cpus)
    if probe.cpu_list:
        cell += f" ({probe.cpu_list})"
    if probe.cpu_quota is not None:
        cell += f" quota {probe.cpu_quota:g}"
    return markup_safe(cell)


def _busy_cell(found: dict[str, Any] | None) -> str:
    """`1.6/2`: cores something keeps busy, of the CPUs online (what the waterfall's `interference` points at)."""
    load = HostLoad.view(found)
    if not found or load.busy_cores is None:
        return "-"
    return f"{load.busy_cores:.1f}/{load.cpus or '?'}"


def _queue_cell(found: dict[str, Any] | None) -> str:
    """Threads running or waiting for a CPU, and the share of the time one waited (`3, 48% wait`)."""
    load = HostLoad.view(found)
    if not found or load.runnable is None:
        return "-"
    wait = load.cpu_wait
    return f"{load.runnable}" + ("" if wait is None else f", {wait:.0%} wait")


def _power_cell(found: dict[str, Any] | None) -> str:
    """The host's power now and its meter (`2.95 pmic`), or `n/a`: no meter, so a run's energy per image is n/a."""
    load = HostLoad.view(found)
    if not found or load.power_w is None:
        return "n/a"
    return markup_safe(f"{load.power_w:.2f} {load.power_source or ''}".strip())


LEFT_OUT_FIRST = ("power W", "warm", "rendezvous", "interface", "+/- ms", "clock ms", "throttled", "temp C", "cpus",
                  "free MB", "timm", "python", "run queue")
"""Where the terminal is too narrow for every column, these go first (a host that is not ready says why on a
line of its own, whatever the width); the busy cores stay: other work on a host is what a slow run asks about."""


def check_table(checks: list) -> Fitted:  # list[HostCheck]
    table = Table(title="pictl check", title_justify="left")
    for col in ("host", "ready", "ssh", "python", "venv", "torch", "timm", "cpus", "busy cores", "run queue",
                "free MB", "temp C", "throttled", "power W", "clock ms", "+/- ms", "interface", "rendezvous", "warm"):
        table.add_column(col)
    for c in checks:
        p = HostProbe.view(c.probe)
        venv = VenvProbe.view(p.venv)
        pkgs = PackageVersions.view(venv.packages)
        iface = InterfaceReport.view(p.interface)
        table.add_row(
            c.host, "[green]yes[/]" if c.ready else "[red]no[/]",
            "ok" if c.authenticated else ("no auth" if c.reachable else "[red]down[/]"),
            p.python, venv.python if p.venv else "-",
            pkgs.torch or "-", pkgs.timm or "-", _cpus_cell(p), _busy_cell(c.load),
            _queue_cell(c.load),
            str(p.mem_available_mb), figure(p.temperature_c, ".1f"), p.throttled or "-",
            _power_cell(c.load),
            figure(c.clock_offset_ms, ".3f"), figure(c.clock_uncertainty_ms, ".3f"),
            f"{iface.name} {iface.address or ''}".strip() if p.interface else "-",
            ("ok" if ReachReport.view(p.rendezvous).ok else "[red]fail[/]") if p.rendezvous else "-",
            _warm_cell(c.warm))
    return Fitted(table, LEFT_OUT_FIRST, whole="; pictl check --json has every field")
