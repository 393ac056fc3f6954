"""`pictl check` on a terminal: one row per host, what it has and whether it is ready."""

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


LEFT_OUT_FIRST = ("warm", "rendezvous", "interface", "+/- ms", "clock ms", "throttled", "temp C", "cpus", "free MB",
                  "timm", "python")
"""Where the terminal is too narrow for every column, these go first (a host that is not ready says why on a
line of its own, whatever the width)."""


def check_table(checks: list) -> Fitted:  # list[HostCheck]
    table = Table(title="pictl check", title_justify="left")
    for col in ("host", "ready", "ssh", "python", "venv", "torch", "timm", "cpus", "free MB", "temp C",
                "throttled", "clock ms", "+/- ms", "interface", "rendezvous", "warm"):
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
            pkgs.get("torch") or "-", pkgs.get("timm") or "-", _cpus_cell(p),
            str(p.get("mem_available_mb", "-")), figure(p.get("temperature_c"), ".1f"), p.get("throttled") or "-",
            figure(c.clock_offset_ms, ".3f"), figure(c.clock_uncertainty_ms, ".3f"),
            f"{iface.get('name')} {iface.get('address') or ''}".strip() if iface else "-",
            ("ok" if reach.get("ok") else "[red]fail[/]") if reach else "-", _warm_cell(c.warm))
    return Fitted(table, LEFT_OUT_FIRST, whole="; pictl check --json has every field")
