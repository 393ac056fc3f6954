"""Energy per image: a Raspberry Pi 5's PMIC rails (a recorded `vcgencmd pmic_read_adc`), x86 RAPL counters,
their samples folded over a window, and the summary's joules per image with each machine counted once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pictl.cluster.monitor import SAMPLE_SCRIPT, HostSample, parse_sample, summarize_samples
from pictl.figure_text import energy_text, joules_text
from pictl.run.energy import energy_summary

RECORDED = Path(__file__).resolve().parents[1] / "support" / "data" / "vcgencmd"
"""A Pi 5's `vcgencmd` answers as recorded on one (pmic_read_adc, get_throttled), as an executable."""


def _rails_by_hand() -> float:
    """The recorded rails' power computed apart from the parser: amps and volts paired by the rail's name."""
    amps, volts = {}, {}
    for line in (RECORDED / "pmic_read_adc.txt").read_text().splitlines():
        name, value = line.split("=")
        rail, kind = name.split()[0].rsplit("_", 1)
        (amps if kind == "A" else volts)[rail] = float(value[:-1])
    return sum(amps[r] * volts[r] for r in amps if r in volts)


def test_the_sampler_reads_a_pi5s_rails_through_vcgencmd_on_the_path() -> None:
    """The host's own script, run with the recorded `vcgencmd` first on its PATH, as a Pi 5 answers it."""
    env = {"PATH": f"{RECORDED}:/usr/bin:/bin"}
    out = subprocess.run(["sh", "-c", SAMPLE_SCRIPT], capture_output=True, text=True, check=True, env=env).stdout
    sample, _ = parse_sample("pi", out, None, 10.0)
    assert sample.power_source == "pmic" and sample.throttled == "0x0"
    assert sample.power_w == pytest.approx(_rails_by_hand(), abs=1e-3) and 2.5 < sample.power_w < 3.5
    assert sample.machine and len(sample.machine) == 36  # the boot id: which hosts share a meter
    bare = subprocess.run(["sh", "-c", SAMPLE_SCRIPT], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin"}).stdout
    if "rapl " not in bare:  # no meter here (no vcgencmd; RAPL absent or readable by root only)
        assert parse_sample("x86", bare, None, 10.0)[0].power_w is None


def test_rapl_counters_give_the_mean_power_between_samples_and_survive_a_wrap() -> None:
    stat = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\n"
    _, first = parse_sample("x86", stat + "rapl 999000000 1000000000\nrapl 5000000 1000000000\n", None, 100.0)
    assert first is not None and first.energy_uj == [(999_000_000, 1_000_000_000), (5_000_000, 1_000_000_000)]
    # Two seconds later: package 0 wrapped (1 J to the top, 3 J past it), package 1 used 6 J.
    sample, _ = parse_sample("x86", stat + "rapl 3000000 1000000000\nrapl 11000000 1000000000\n", first, 102.0)
    assert sample.power_source == "rapl" and sample.power_w == pytest.approx((4.0 + 6.0) / 2.0)


def _sample(at: float, watts: float | None, *, host: str = "h", machine: str = "m") -> HostSample:
    return HostSample(host, True, at, since=at - 2.0, power_w=watts, power_source="pmic" if watts else None,
                      machine=machine)


def test_power_over_a_window_is_weighted_by_overlap_and_none_when_half_is_unmeasured() -> None:
    # Readings cover (8,10], (10,12], (12,14]: the window [9, 13] holds 1 s of the first, 2 of the second and 1 of
    # the third.
    samples = [_sample(10.0, 4.0), _sample(12.0, 6.0), _sample(14.0, 2.0)]
    window = summarize_samples(samples, 9.0, 13.0)
    assert window is not None and window["power_w_mean"] == pytest.approx((4 + 12 + 2) / 4)
    assert window["power_source"] == "pmic" and window["machine"] == "m"
    # A window of 10 s with one reading in it: its meter is there, but most of it went unmeasured.
    short = summarize_samples([_sample(12.0, 6.0)], 9.0, 19.0)
    assert short is not None and short["power_w_mean"] is None and short["power_source"] == "pmic"


def _host(pipeline: float | None, baseline: float | None = None, machine: str = "m",
          source: str | None = "pmic") -> dict:
    def window(watts: float | None) -> dict:
        return {"samples": 3, "power_w_mean": watts, "power_source": source,
                "machine": machine}
    return {"stages": [0], "during_pipeline": window(pipeline),
            **({"during_baseline": window(baseline)} if baseline is not None else {})}


def test_joules_per_image_count_each_machine_once() -> None:
    # Two Pis, and a third host that is the first Pi again (same boot id): two meters, not three.
    hosts = {"pi0": _host(6.0, baseline=5.0, machine="a"), "pi1": _host(4.0, machine="b"),
             "pi0b": _host(6.2, machine="a")}
    e = energy_summary(hosts, "pi0", ips=4.0, serial_ips=2.0, serial_reused=False, pipeline_ran=True)
    assert e["machines"] == 2 and e["pipeline_power_w"] == pytest.approx(6.1 + 4.0)
    assert e["pipeline_j_per_image"] == pytest.approx(10.1 / 4.0, abs=1e-4)
    assert e["serial_j_per_image"] == pytest.approx(5.0 / 2.0) and e["source"] == "pmic"
    assert e["pipeline_unmeasured"] is None and e["serial_unmeasured"] is None


def test_a_host_without_a_meter_makes_the_figure_na_and_is_named() -> None:
    hosts = {"pi0": _host(6.0, baseline=5.0, machine="a"), "laptop": _host(None, machine="c", source=None)}
    e = energy_summary(hosts, "pi0", ips=4.0, serial_ips=2.0, serial_reused=False, pipeline_ran=True)
    assert e["pipeline_j_per_image"] is None and e["pipeline_power_w"] is None
    assert e["pipeline_unmeasured"] == "host 'laptop' has no power meter pictl can read"
    assert e["serial_j_per_image"] == pytest.approx(2.5)  # the serial host has its meter
    short = energy_summary({"pi0": _host(None, baseline=5.0)}, "pi0", ips=4.0, serial_ips=2.0,
                           serial_reused=True, pipeline_ran=True)
    assert short["pipeline_unmeasured"] == \
        "host 'pi0': the window was too short for its meter's samples (one every 2 s)"
    assert short["serial_j_per_image"] is None and "the serial run was reused" in short["serial_unmeasured"]
    # No sample inside the window: a host whose samples read a meter during the run took too few; one whose
    # samples never did has none.
    for meter, why in (("pmic", "host 'pi0': the window was too short for its meter's samples (one every 2 s)"),
                       (None, "host 'pi0' has no power meter pictl can read")):
        unsampled = energy_summary({"pi0": {"stages": [0], "during_pipeline": None, "power_meter": meter}}, None,
                                   ips=4.0, serial_ips=None, serial_reused=None, pipeline_ran=True)
        assert unsampled["pipeline_unmeasured"] == why


def test_joules_are_written_one_way() -> None:
    assert [joules_text(v) for v in (0.45, 5.123, 12.34, 123.4, 1234.5, None)] == \
        ["0.450", "5.12", "12.3", "123", "1234", "n/a"]
    assert energy_text(2.526, 2.5) == "2.53 J/img (serial 2.50)" and energy_text(None, None) == "n/a"
    assert energy_text(None, 2.5) == "n/a J/img (serial 2.50)"


def test_the_run_panel_spends_a_row_on_energy_only_where_a_host_has_a_meter() -> None:
    from pictl.records.run_details import metered
    from pictl.summary_models import RunSummary

    def run(hosts: dict, reused: bool) -> RunSummary:
        e = energy_summary(hosts, next(iter(hosts)), ips=4.0, serial_ips=2.0, serial_reused=reused, pipeline_ran=True)
        return RunSummary.model_validate({"status": "ok", "run_id": "r", "stages": 2, "hosts": hosts, "energy": e})

    none = run({"h0": {**_host(None, baseline=None, source=None), "power_meter": None}}, True)
    short = run({"pi0": {**_host(None), "power_meter": "pmic"}}, True)
    measured = run({"pi0": {**_host(6.0, baseline=5.0), "power_meter": "pmic"}}, False)
    assert [metered(s) for s in (none, short, measured)] == [False, True, True]
