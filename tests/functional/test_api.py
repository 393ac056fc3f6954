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
    heard = _documented_progress_hook()
    again = pictl.run_experiment(cluster, options, runs_dir=tmp_path / "runs", on_event=heard)  # an options object
    # The progress hook docs/running.md shows heard every step and each pass, serial and pipeline, as it happened.
    lines = heard.lines  # type: ignore[attr-defined]
    steps = [line.split(":")[0] for line in lines]
    assert "push" in steps and steps.index("push") < steps.index("pipeline"), lines
    assert any(line.startswith("pipeline: launching 2 stage(s)") for line in lines), lines
    assert any(line.startswith("pipeline pass 1: ") and line.endswith(" img/s") for line in lines), lines
    assert again.serial_reused or any(line.startswith("serial pass 1: ") for line in lines), lines
    assert again.outputs_match is True and again.baseline is not None
    # the cached baseline is reused, unless the host's state changed meanwhile (a loaded machine): then it says why
    assert again.serial_reused is True or again.baseline.not_reused_because
    assert [s.run_id for s in pictl.runs(tmp_path / "runs")] == [again.run_id, summary.run_id]


def _documented_progress_hook() -> object:
    """The `on_event` example of docs/running.md, run as written, its prints kept (`.lines`)."""
    import re

    from support.cli import ROOT

    doc = (ROOT / "docs" / "running.md").read_text()
    section = doc[doc.index("### Progress as it happens: `on_event`"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    example = code.group(1).replace("summary = pictl.run_experiment(", "call = dict(")  # the test runs its own
    lines: list[str] = []
    namespace: dict = {"print": lambda *a, **_k: lines.append(" ".join(map(str, a)))}
    exec(compile(example, "docs/running.md", "exec"), namespace)  # noqa: S102 - the documented example itself
    show = namespace["show"]
    show.lines = lines
    return show


def test_bad_input_raises_before_anything_starts(tmp_path: Path) -> None:
    cluster = pictl.load_cluster(write_cluster(tmp_path / "cluster", 2))
    with pytest.raises(ConfigError, match="stages do not fit"):
        pictl.run_experiment(cluster, stages=5, runs_dir=tmp_path / "runs")
    with pytest.raises(ConfigError):
        pictl.run_experiment(cluster, stages=2, images=0, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_sweep_and_a_training_job_from_python_return_typed_results(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PICTL_CACHE_DIR", str(tmp_path / "cache"))
    cluster = pictl.load_cluster(write_cluster(tmp_path / "cluster", 2))
    result = pictl.sweep(cluster, stages=[1, 2], chunks=[2], policies=["equal"], images=4, warmup=0, repeats=1,
                         out=tmp_path / "sweep", rounds=1, max_rounds=1, runs_dir=tmp_path / "runs")
    assert isinstance(result, pictl.SweepResult) and result.directory == tmp_path / "sweep"
    rows = sorted(result.rows, key=lambda r: r["stages"])  # (fastest first: whichever that was here)
    assert [(r["stages"], r["policy"], r["status"]) for r in rows] == [(1, "serial", "ok"), (2, "equal", "ok")]
    assert (result.directory / "table.csv").is_file() and rows[1]["outputs_match"] is True
    assert {r.run_id for r in pictl.runs(tmp_path / "runs")} == {i for r in rows for i in r["run_ids"]}

    job = pictl.train(cluster, pictl.TrainOptions(
        mode="pipeline", stages=2, batch_size=8, chunks=2, steps=3, train_images=16, eval_images=8, check_steps=0,
        save=False, model="vit_tiny_patch16_224",
        model_args={"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 96, "num_heads": 4}),
        root=tmp_path / "trains")
    assert isinstance(job, pictl.TrainSummary) and job.status == "ok" and job.mode == "pipeline"
    assert [p.step for p in job.losses] == [1, 2, 3] and all(p.loss is not None for p in job.losses)
