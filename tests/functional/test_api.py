"""pictl as a library, through its public names only (`import pictl`): a run returns its typed summary, a
run that fails returns its summary too, bad input raises before anything starts, and past runs read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.clusters import write_cluster

import pictl
from pictl.errors import ConfigError

pytestmark = pytest.mark.slow


def test_a_run_from_python_returns_its_typed_summary_and_is_listed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PICTL_CACHE_DIR", str(tmp_path / "cache"))
    cluster = pictl.load_cluster(write_cluster(tmp_path / "cluster", 2))
    summary = pictl.run_experiment(cluster, stages=2, split=["blocks.6"], images=6, warmup=0, repeats=1,
                        runs_dir=tmp_path / "runs")
    assert isinstance(summary, pictl.RunSummary)
    assert summary.status == "ok" and summary.outputs_match is True and summary.stages == 2
    assert summary.speedup == pytest.approx(summary.throughput_ips / summary.serial_ips, rel=1e-3)
    assert summary.waterfall is not None and summary.startup is not None
    (listed,) = pictl.runs(tmp_path / "runs")
    assert listed.run_id == summary.run_id and listed.speedup == summary.speedup

    options = pictl.RunOptions(stages=2, split=["blocks.6"], images=6, warmup=0, repeats=1, atol=0.0)
    again = pictl.run_experiment(cluster, options, runs_dir=tmp_path / "runs")  # an options object
    assert again.outputs_match is True and again.baseline is not None
    # the cached baseline is reused, unless the host's state changed meanwhile (a loaded machine): then it says why
    assert again.serial_reused is True or again.baseline.not_reused_because
    assert [s.run_id for s in pictl.runs(tmp_path / "runs")] == [again.run_id, summary.run_id]


def test_bad_input_raises_before_anything_starts(tmp_path: Path) -> None:
    cluster = pictl.load_cluster(write_cluster(tmp_path / "cluster", 2))
    with pytest.raises(ConfigError, match="stages do not fit"):
        pictl.run_experiment(cluster, stages=5, runs_dir=tmp_path / "runs")
    with pytest.raises(ConfigError):
        pictl.run_experiment(cluster, stages=2, images=0, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
