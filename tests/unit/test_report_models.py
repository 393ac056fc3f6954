"""The report's Part 3 table, from run and pruning-job summaries as pictl writes them."""

from __future__ import annotations

from pictl.job_summaries import PruneSummary
from pictl.records.report import models_section
from pictl.summary_models import RunSummary

ART = {"path": "/p/model.safetensors", "digest": "d", "base_model": "deit_small_patch16_224", "ratio": 0.15,
       "importance": "hessian", "params": 16_000_000, "params_base": 22_000_000, "macs": 3_370_000_000,
       "macs_base": 4_610_000_000, "top1_before": 0.90, "top1_pruned": 0.12, "top1": 0.886}


def _run(stages: int, ips: float, serial: float, artifact: dict | None = None) -> RunSummary:
    return RunSummary.model_validate({
        "run_id": f"r{stages}{artifact is not None}", "model": "deit_small_patch16_224", "stages": stages,
        "status": "ok", "throughput_ips": ips, "serial_ips": serial, "artifact": artifact})


def test_speedups_are_against_the_unpruned_serial_run() -> None:
    lines = models_section([_run(4, 28.0, 8.0), _run(4, 34.0, 10.0, ART)], [])
    base = next(line for line in lines if "(unpruned)" in line)
    pruned = next(line for line in lines if "pruned hessian 0.15" in line)
    assert "22,000,000" in base and "90.0%" in base and "4: 3.50x" in base
    # 34 img/s against the unpruned 8 img/s serial run, not the pruned model's own 10.
    assert "16,000,000" in pruned and "12.0%" in pruned and "88.6%" in pruned
    assert "1.25x" in pruned and "4: 4.25x" in pruned


def test_one_model_alone_makes_no_table() -> None:
    assert models_section([_run(2, 14.0, 8.0)], []) == []


def test_a_pruning_jobs_summary_gives_its_row_and_the_unpruned_one() -> None:
    """The pruning job's own figures (parameters, MACs, top-1 before and after) fill both rows; the runs' give
    the throughput."""
    job = PruneSummary.model_validate({
        "status": "ok", "job_id": "p1", "artifact": ART["path"], "base_model": ART["base_model"], "ratio": 0.15,
        "importance": "hessian", "params_base": 22_000_000, "params": 16_000_000, "macs_base": 4_610_000_000,
        "macs": 3_370_000_000, "top1_before": 0.90, "top1_pruned": 0.12, "top1": 0.886})
    lines = models_section([_run(4, 28.0, 8.0)], [job])  # the pruned model not run yet: no throughput
    base = next(line for line in lines if "(unpruned)" in line)
    pruned = next(line for line in lines if "pruned hessian 0.15" in line)
    assert "22,000,000" in base and "90.0%" in base and "4: 3.50x" in base
    assert "16,000,000" in pruned and "12.0%" in pruned and "88.6%" in pruned and pruned.endswith("| - | - | - |")
