"""Energy per image: the run's hosts' mean power while the pipeline ran (and while the serial run ran), over
the images per second of those windows. Joules per image = watts / (images per second).

Power comes from the host samples (`pictl.cluster.monitor`): a Raspberry Pi 5's PMIC rails or an x86 host's
RAPL package counters. Hosts with one boot id are one machine with one meter (local hosts, or test hosts on
one machine), so each machine is counted once. A figure needs every machine of its window measured: with one
host unable to measure, the figure is None and the reason says which host; it is never a guess. The meters
read the whole board or package, so another team's work on the same hosts is in the figure too (the run's
flags say when other work ran).
"""

from __future__ import annotations

from typing import Any

from pictl.summary_figures import EnergyFigures
from pictl.summary_models import HostRecord, SampleWindow


def _machines(windows: dict[str, tuple[SampleWindow | None, str | None]]
              ) -> tuple[float | None, str | None, int, set[str]]:
    """The power of the machines behind `windows` (host -> its window and the meter its samples read during the
    run), each machine once; or None and why."""
    per_machine: dict[str, list[float]] = {}
    sources: set[str] = set()
    for host, (window, meter) in windows.items():
        if window is None or window.power_w_mean is None:
            # A host whose samples never read a meter has none; one that has a meter took too few samples here.
            metered = meter or (window is not None and window.power_source)
            why = (f"host '{host}': the window was too short for its meter's samples (one every 2 s)" if metered
                   else f"host '{host}' has no power meter pictl can read")
            return None, why, 0, sources
        per_machine.setdefault(window.machine or f"host:{host}", []).append(window.power_w_mean)
        if window.power_source:
            sources.add(window.power_source)
    # Hosts of one machine read one meter at slightly different instants: their mean is that machine's power.
    total = sum(sum(readings) / len(readings) for readings in per_machine.values())
    return total, None, len(per_machine), sources


def energy_summary(hosts: dict[str, Any], baseline_host: str | None, ips: float | None,
                   serial_ips: float | None, *, serial_reused: bool | None, pipeline_ran: bool) -> dict[str, Any]:
    """The summary's `energy` from its `hosts` records and its throughputs."""
    records = {name: HostRecord.model_validate(rec) for name, rec in hosts.items()}
    e = EnergyFigures()
    sources: set[str] = set()
    if not pipeline_ran or not records:
        e.pipeline_unmeasured = "no pipeline ran"
    else:
        watts, e.pipeline_unmeasured, machines, found = _machines(
            {name: (r.during_pipeline, r.power_meter) for name, r in records.items()})
        e.machines, sources = machines or None, sources | found
        if watts is not None:
            e.pipeline_power_w = round(watts, 3)
            e.pipeline_j_per_image = round(watts / ips, 4) if ips else None
    if serial_reused:
        e.serial_unmeasured = ("the serial run was reused (a cached baseline, or the comparison's reference), "
                               "not measured in this run: `--fresh-baseline` measures it")
    elif baseline_host is None or baseline_host not in records:
        e.serial_unmeasured = "no serial run was measured"
    else:
        record = records[baseline_host]
        watts, e.serial_unmeasured, _, found = _machines({baseline_host: (record.during_baseline, record.power_meter)})
        sources |= found
        if watts is not None:
            e.serial_power_w = round(watts, 3)
            e.serial_j_per_image = round(watts / serial_ips, 4) if serial_ips else None
    e.source = ",".join(sorted(sources)) or None
    return e.model_dump(mode="python")  # every field, a None included (summary.json says what was not measured)
