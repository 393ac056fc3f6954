"""`pictl check` on a terminal: one row per host, what it has, what keeps it busy now, and whether it is ready."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from pictl.console import Fitted
from pictl.text import figure, markup_safe


def _warm_cell(warm: dict[str, Any] | None) -> str:
    if not warm or (warm.get("error") and warm.get("answering") is not False):
        return "-"
    if not warm.get("enabled"):
        return "cold"
    if not warm.get("running"):
        return "none"
    if warm.get("answering") is False:
        return "[red]no answer[/]"
    return markup_safe(f"pid {warm.get('pid')} {warm.get('age_s', 0):.0f}s {warm.get('rss_mb')}MB")


def _cpus_cell(probe: dict[str, Any]) -> str:
    """The CPUs the host's processes may use: their count, the cores they are pinned to (`cpus` in hosts.toml,
    or a taskset), and a CFS quota that caps them below that."""
    cell = str(probe.get("cpus", "-"))
    if probe.get("cpu_list"):
        cell += f" ({probe['cpu_list']})"
    if probe.get("cpu_quota") is not None:
        cell += f" quota {probe['cpu_quota']:g}"
    return markup_safe(cell)


def _busy_cell(load: dict[str, Any] | None) -> str:
    """`1.6/2`: cores something keeps busy, of the CPUs online (what the waterfall's `interference` points at)."""
    if not load or load.get("busy_cores") is None:
        return "-"
    return f"{load['busy_cores']:.1f}/{load.get('cpus') or '?'}"


def _queue_cell(load: dict[str, Any] | None) -> str:
    """Threads running or waiting for a CPU, and the share of the time one waited (`3, 48% wait`)."""
    if not load or load.get("runnable") is None:
        return "-"
    wait = load.get("cpu_wait")
    return f"{load['runnable']}" + ("" if wait is None else f", {wait:.0%} wait")


def _power_cell(load: dict[str, Any] | None) -> str:
    """The host's power now and its meter (`2.95 pmic`), or `n/a`: no meter, so a run's energy per image is n/a."""
    if not load or load.get("power_w") is None:
        return "n/a"
    return markup_safe(f"{load['power_w']:.2f} {load.get('power_source') or ''}".strip())


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
        p = c.probe
        venv = p.get("venv", {})
        pkgs = venv.get("packages", {})
        iface = p.get("interface") or {}
        reach = p.get("rendezvous") or {}
        table.add_row(
            c.host, "[green]yes[/]" if c.ready else "[red]no[/]",
            "ok" if c.authenticated else ("no auth" if c.reachable else "[red]down[/]"),
            p.get("python", "-"), venv.get("python", "missing") if venv else "-",
            pkgs.get("torch") or "-", pkgs.get("timm") or "-", _cpus_cell(p), _busy_cell(c.load),
            _queue_cell(c.load),
            str(p.get("mem_available_mb", "-")), figure(p.get("temperature_c"), ".1f"), p.get("throttled") or "-",
            _power_cell(c.load),
            figure(c.clock_offset_ms, ".3f"), figure(c.clock_uncertainty_ms, ".3f"),
            f"{iface.get('name')} {iface.get('address') or ''}".strip() if iface else "-",
            ("ok" if reach.get("ok") else "[red]fail[/]") if reach else "-", _warm_cell(c.warm))
    return Fitted(table, LEFT_OUT_FIRST, whole="; pictl check --json has every field")
