"""`pictl sweep`: values checked before anything runs; a real sweep writes its table and plots; under load that
comes and goes, every configuration is measured against one reference in interleaved rounds, ranked by it, and
two identical configurations are a tie."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import write_cluster
from support.load import ToggledLoad

from pictl.events import Phase
from pictl.inventory import load_cluster
from pictl.jobs.sweep import RoundsPlan, SweepPoint, run_sweep
from pictl.planning.presets import resolve_options


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
    (["--rounds", "0"], "--rounds: must be a whole number between 1 and 20 (got 0)"),
    (["--rounds", "4", "--max-rounds", "3"], "--max-rounds: must be a whole number between 4 and 20 (got 3)"),
    (["--budget", "-5"], "--budget: must be a number of seconds above 0 (got -5.0)"),
    (["--train", "--rounds", "2"], "--rounds: a training sweep (--train) runs each job once"),
])
def test_a_value_that_cannot_run_stops_the_sweep_before_it_starts(tmp_path: Path, pictl_env, pictl_forks, args: list,
                                                                   fragment: str) -> None:
    hosts = write_cluster(tmp_path / "cluster", 4)
    proc = pictl_forks.run(["sweep", "--hosts", str(hosts), "--out", str(tmp_path / "sweep"), *args], pictl_env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"pictl: error: {fragment}")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_sweep_writes_table_and_plots(tmp_path: Path, pictl_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    out = tmp_path / "sweep"
    proc = run_pictl(["sweep", "--hosts", str(hosts), "--out", str(out), "--stages", "1,2", "--chunks", "2",
                      "--wire", "int8", "--images", "4", "--warmup", "0", "--repeats", "1", "--rounds", "2",
                      "--max-rounds", "2", "--json"], pictl_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = json.loads((out / "sweep.json").read_text())
    rows = sweep["rows"]
    assert json.loads(proc.stdout) == {"sweep_dir": str(out), "rows": rows}  # --json: the rows on stdout
    # One chunk size keeps CI short: the chunk plot is drawn for several (bench/ and `pictl sweep` do that).
    serial, pipeline = (next(r for r in rows if r["stages"] == n) for n in (1, 2))
    assert [(r["stages"], r["chunk"], r["policy"], r["wire"]) for r in (serial, pipeline)] == [
        (1, 2, "serial", "fp32"), (2, 2, "equal", "int8")]
    assert all(r["status"] == "ok" and r["outputs_match"] is True and r["rounds"] == 2 for r in rows)
    # The serial point is the sweep's one reference: 1x in every round, and what every row divides by.
    assert serial["speedup"] == 1.0 and serial["run_ids"] == sweep["reference"]["run_ids"]
    assert pipeline["serial_ips"] == serial["throughput_ips"] and pipeline["reference"] == serial["reference"]
    assert pipeline["speedup_low"] <= pipeline["speedup"] <= pipeline["speedup_high"]
    assert pipeline["efficiency"] == pytest.approx(pipeline["speedup"] / 2, abs=1e-3)
    # Per image, the cut's 197x384 state(s) (two at an in-block cut) in int8: a byte a value, plus a scale a token.
    states, rest = divmod(pipeline["bytes_per_image"], 197 * 384 + 197 * 4)
    assert states in (1, 2) and rest == 0 and pipeline["agreement"] >= 0.99 and serial["agreement"] is None
    assert len(list(csv.DictReader((out / "table.csv").open()))) == 2
    for plot in ("speedup_vs_stages.png", "wire_formats.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "table.md").read_text()
    assert "speedup_interval" in table and "Every speedup is over one reference, round by round: serial on h0 " \
                                            "(chunk 2" in table
    assert [line for line in table.splitlines() if line.startswith("- ")] == [f"- {v}" for v in sweep["verdicts"]]

    # Every run is a run of its own under the runs root, listed with its sweep.
    runs = tmp_path / "runs"
    ref = json.loads((runs / serial["run_ids"][0] / "summary.json").read_text())
    assert ref["split_points"] == [] and ref["per_stage"][0]["modules"][0] == "patch_embed"
    assert ref["per_stage"][0]["modules"][-1] == "head" and ref["part_of"]["role"] == "reference"
    run = runs / pipeline["run_id"]
    summary = json.loads((run / "summary.json").read_text())
    # The pipeline run was planned before the sweep began (one process for all of them), the serial
    # one inside its own baseline run: no planning process of their own.
    assert "1 sweep run(s) planned in one process" in proc.stderr
    # Its four runs borrowed the hosts the sweep held: the code pushed once, before the first.
    assert len([line for line in proc.stderr.splitlines() if line.startswith("pictl push: ")]) == 1, proc.stderr
    assert summary["plan_reused"] is True and summary["baseline"]["reference_run"] in serial["run_ids"]
    listed = json.loads(run_pictl(["runs", "--json"], pictl_env).stdout)
    assert sorted(r["part_of"] for r in listed) == sorted(
        [f"sweep {out.name} r{k} ref" for k in (1, 2)] + [f"sweep {out.name} r{k}" for k in (1, 2)])
    reported = run_pictl(["report", str(out), pipeline["run_id"], "--out", str(tmp_path / "report")], pictl_env)
    assert reported.returncode == 0, reported.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"## Sweep {out.name}" in text and f"## Run {run.name}" in text
    assert "| h0 (rank 0) -> rank 1 |" in text
    link = next(line for line in text.splitlines() if "-> rank 1 |" in line)
    assert float(link.split("|")[2]) > 0 and float(link.split("|")[3]) >= float(link.split("|")[2])
    assert (tmp_path / "report" / f"{run.name}-stages.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_pictl(["report", str(tmp_path), "--out", str(tmp_path / "r2")], pictl_env)
    assert bad.returncode == 2 and "not a run directory" in bad.stderr and not (tmp_path / "r2").exists()


@pytest.mark.slow
@pytest.mark.alone
async def test_under_load_that_comes_and_goes_a_sweep_ranks_by_one_reference_and_twins_tie(
        tmp_path: Path, pictl_env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy loop pinned to one CPU, switched on and off while the sweep measures: the 2-stage pipeline (about
    1.8x the serial run on two cores, quiet) ranks above the serial run, two identical 2-stage configurations
    come out a tie within noise, and every row and every run names the same reference, round by round."""
    for name in ("PICTL_RUNS_DIR", "PICTL_CACHE_DIR", "PICTL_PROFILES_DIR"):
        monkeypatch.setenv(name, pictl_env[name])
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    base = resolve_options(None, {"images": 8, "warmup": 1, "repeats": 1, "threads": 1})
    points = [SweepPoint(1, 1, "serial"), SweepPoint(2, 1, "equal"), SweepPoint(2, 1, "equal")]
    said: list[str] = []
    out, runs = tmp_path / "sweep", tmp_path / "runs"
    leases: list[tuple[str, object, object, object]] = []

    def held(_session: object, _k: int, _n: int) -> None:  # as each run starts: who holds each host's lease
        for h in ("h0", "h1"):
            record = json.loads((tmp_path / "cluster" / h / "lease").read_text() or "{}")
            leases.append((h, record.get("pid"), record.get("run_id"), record.get("kind")))

    with ToggledLoad(on_s=(0.5, 2.5), off_s=(0.5, 2.5)) as load:
        rows = await run_sweep(cluster, base, points, out, runs_root=runs, rounds=RoundsPlan(3, 3), on_session=held,
                               on_event=lambda e: said.append(e.message) if isinstance(e, Phase) else None)
    assert load.switches >= 4, "the load never came and went during the sweep"
    assert [r["label"] for r in rows][-1] == "serial" and all(r["status"] == "ok" for r in rows)
    twins = [r for r in rows if r["stages"] == 2]
    assert all(r["speedup"] > 1 for r in twins) and twins[0]["place"] == twins[1]["place"]
    assert twins[0]["label"] in twins[1]["tied_with"]
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["verdicts"][0].startswith(f"{twins[0]['label']} and {twins[1]['label']}: a tie within noise")
    progress = [line for line in said if line.startswith("[")]
    assert len(progress) == 9 and progress[-1].startswith("[9/9] round 3, ")
    # The hosts were held once for the whole sweep: every run started with both leases held by the same holder,
    # the sweep (not by a run of its own), the code pushed once, and both leases freed at its end.
    assert len(leases) == 18 and {(h, run_id, kind) for h, _, run_id, kind in leases} == {
        ("h0", "sweep", "sweep"), ("h1", "sweep", "sweep")}, leases
    assert len({(h, pid) for h, pid, _, _ in leases}) == 2, leases
    pushes = [line for line in said if "pushed to" in line or line.startswith("code up to date on")]
    assert len(pushes) == 1, pushes
    assert all((tmp_path / "cluster" / h / "lease").read_text() == "" for h in ("h0", "h1"))

    # One reference for every row: the serial run on h0, measured first in each round and handed to that
    # round's runs, which divide by it and check their outputs against it.
    assert len({r["reference"] for r in rows}) == 1 and rows[0]["reference"].startswith("serial on h0 (chunk 1")
    for k, round_ in enumerate(sweep["rounds"], start=1):
        ref_id, ref_ips = round_["reference"]["run_id"], round_["reference"]["ips"]
        assert round_["order"] == (["2 stages, equal", "2 stages, equal #2"][:: 1 if k % 2 else -1])
        for label, run in round_["runs"].items():
            s = json.loads((runs / run["run_id"] / "summary.json").read_text())
            assert s["baseline"]["reference_run"] == ref_id and s["serial_ips"] == pytest.approx(ref_ips, rel=1e-4)
            assert s["startup"]["hosts_held_by"] == "sweep sweep"  # (its connect and push: the sweep's, once)
            assert s["outputs_match"] is True and s["part_of"] == {
                "kind": "sweep", "name": "sweep", "dir": str(out.absolute()), "round": k, "role": "candidate",
                "configuration": label}
    first = sweep["rounds"][0]
    twin_runs = [first["runs"][t["label"]]["run_id"] for t in twins]
    compared = run_pictl(["runs", "compare", *twin_runs, "--json"], pictl_env)
    assert compared.returncode == 0, compared.stderr
    verdict = json.loads(compared.stdout)[1]["verdict"]
    assert verdict["outcome"] in ("too close to call", "equivalent") and "a tie within noise" in verdict["text"]
    against = run_pictl(["runs", "compare", first["reference"]["run_id"], twin_runs[0]], pictl_env)
    assert against.returncode == 0 and f"against {first['reference']['run_id']}: in sweep sweep: " in against.stdout
