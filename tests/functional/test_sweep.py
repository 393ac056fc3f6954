"""`pictl sweep`: values checked before anything runs; a real sweep writes its table and plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import write_cluster


@pytest.mark.parametrize(("args", "fragment"), [
    (["--stages", "1,9"], "sweep value stages=9 chunk=1 policy=equal wire=fp32: 9 stages do not fit"),
    (["--wire", "fp32,int4"], "--wire: 'int4' is not a wire format"),
    (["--stages", "1,x"], "--stages: '1,x' is not a comma-separated list of whole numbers"),
    (["--stages", "1,\u0663"], "--stages: '1,\u0663' is not a comma-separated list of whole numbers"),
    (["--policy", "equal,greedy"], "--policy[1]: must be 'equal' or 'balanced' (got 'greedy')"),
    (["--split", "blocks.2"], "--split: split points are a training sweep's setting"),
    (["--train", "--split", ","], "--split: ',' names no split point"),
    (["--train", "--chunks", "2,3"], "sweep point single, 1 rank(s), 3 chunk(s): chunks 3 do not divide the batch "
                                      "of 8 (every microbatch has the same size)"),
    (["--train", "--workers", "0,x"], "--workers: '0,x' is not a comma-separated list of whole numbers"),
])
def test_a_value_that_cannot_run_stops_the_sweep_before_it_starts(tmp_path: Path, pictl_env, args: list,
                                                                   fragment: str) -> None:
    hosts = write_cluster(tmp_path / "cluster", 4)
    proc = run_pictl(["sweep", "--hosts", str(hosts), "--out", str(tmp_path / "sweep"), *args], pictl_env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"pictl: error: {fragment}")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_sweep_writes_table_and_plots(tmp_path: Path, pictl_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    out = tmp_path / "sweep"
    proc = run_pictl(["sweep", "--hosts", str(hosts), "--out", str(out), "--stages", "1,2", "--chunks", "2",
                      "--wire", "int8", "--images", "4", "--warmup", "0", "--repeats", "1", "--json"],
                     pictl_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert json.loads(proc.stdout) == {"sweep_dir": str(out), "rows": rows}  # --json: the rows on stdout
    # One chunk size keeps CI short: the chunk plot is drawn for several (bench/ and `pictl sweep` do that).
    assert [(r["stages"], r["chunk"], r["policy"], r["wire"]) for r in rows] == [
        (1, 2, "serial", "fp32"), (2, 2, "equal", "int8")]
    assert all(r["status"] == "ok" and r["outputs_match"] is True for r in rows)
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["serial_ips"] == rows[0]["throughput_ips"]  # compared with its chunk's serial baseline
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2, abs=1e-3)
    # Per image, the cut's 197x384 state(s) (two at an in-block cut) in int8: a byte a value, plus a scale a token.
    states, rest = divmod(rows[1]["bytes_per_image"], 197 * 384 + 197 * 4)
    assert states in (1, 2) and rest == 0 and rows[1]["agreement"] >= 0.99 and rows[0]["agreement"] is None
    assert len(list(csv.DictReader((out / "table.csv").open()))) == 2
    for plot in ("speedup_vs_stages.png", "wire_formats.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "table.md").read_text().count("\n") == 4 and "wire" in (out / "table.md").read_text()

    serial = json.loads(next(p for p in (out / "runs").iterdir() if "-s1-" in p.name).joinpath(
        "summary.json").read_text())  # one stage is the serial run: no cut, the whole model on one host
    assert serial["split_points"] == [] and serial["per_stage"][0]["modules"][0] == "patch_embed"
    assert serial["per_stage"][0]["modules"][-1] == "head" and serial["outputs_match"] is True
    run = next(p for p in (out / "runs").iterdir() if "-s2-" in p.name)
    # The pipeline run was planned before the sweep began (one process for all of them), the serial
    # one inside its own baseline run: no planning process of their own.
    assert "1 sweep run(s) planned in one process" in proc.stderr
    assert json.loads((run / "summary.json").read_text())["plan_reused"] is True
    reported = run_pictl(["report", str(out), str(run), "--out", str(tmp_path / "report")], pictl_env)
    assert reported.returncode == 0, reported.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"## Sweep {out.name}" in text and f"## Run {run.name}" in text
    assert "| h0 (rank 0) -> rank 1 |" in text
    link = next(line for line in text.splitlines() if "-> rank 1 |" in line)
    assert float(link.split("|")[2]) > 0 and float(link.split("|")[3]) >= float(link.split("|")[2])
    assert (tmp_path / "report" / f"{run.name}-stages.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_pictl(["report", str(tmp_path), "--out", str(tmp_path / "r2")], pictl_env)
    assert bad.returncode == 2 and "not a run directory" in bad.stderr and not (tmp_path / "r2").exists()
