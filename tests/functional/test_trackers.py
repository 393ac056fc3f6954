"""`--track tensorboard` and `--track wandb`: a sweep, its run and a training job written to both trackers
read back with the trackers' own readers hold the figures their summaries hold; `pictl track` writes a past
run the same way; a tracker that is not one, in a flag or in the inventory, is refused before anything runs."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import write_cluster
from support.trackers import tensorboard_hparams, tensorboard_scalars, wandb_run

TINY = ["--model", "vit_tiny_patch16_224", "--model-arg", "img_size=32", "--model-arg", "patch_size=8",
        "--model-arg", "depth=2", "--model-arg", "embed_dim=96", "--model-arg", "num_heads=4"]
BOTH = ["--track", "tensorboard", "--track", "wandb"]


@pytest.fixture
def env(pictl_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    # W&B keeps settings of its own in the home directory: the test's stay in its own.
    return {**pictl_env, "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


@pytest.mark.slow
def test_a_sweep_and_its_run_read_back_from_tensorboard_and_wandb(tmp_path: Path, env: dict[str, str]) -> None:
    hosts, out = write_cluster(tmp_path / "cluster", 2), tmp_path / "sweep"
    proc = run_pictl(["sweep", "--hosts", str(hosts), "--out", str(out), "--stages", "2", "--images", "4",
                      "--warmup", "0", "--repeats", "2", *BOTH, "--json"], env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "track: tensorboard:" in proc.stderr and "track: wandb:" in proc.stderr
    (run,) = (out / "runs").iterdir()
    s = json.loads((run / "summary.json").read_text())

    tb = tensorboard_scalars(run / "tensorboard")
    for key in ("throughput_ips", "serial_ips", "speedup", "efficiency"):
        assert tb[key] == [(0, pytest.approx(s[key], rel=1e-6))], key
    for st in s["per_stage"]:
        for key in ("measured_ms", "wait_ms", "send_ms"):
            assert tb[f"stage{st['rank']}/{key}"] == [(0, pytest.approx(st[key], rel=1e-6))]
    for term in s["waterfall"]["terms"]:
        assert tb[f"waterfall/{term['term']}"][0][1] == pytest.approx(term["points"], abs=1e-6)
    assert tb["latency/p50_ms"][0][1] == pytest.approx(s["latency"]["pipeline"]["p50_ms"], rel=1e-6)
    passes = tb["pipeline/pass_ips"]  # over time: each timed pass; their mean is the throughput
    assert [step for step, _ in passes] == [0, 1]
    assert statistics.mean(v for _, v in passes) == pytest.approx(s["throughput_ips"], rel=0.02)
    assert {f"rank{r}/compute_ms_per_microbatch" for r in (0, 1)} <= set(tb)
    assert any(tag.startswith("host/h0/cpu_pct") for tag in tb)  # the run's host samples, over time
    hparams = tensorboard_hparams(run / "tensorboard")
    assert hparams["stages"] == 2 and hparams["split"] == ",".join(s["split_points"]) and hparams["images"] == 4

    wb = wandb_run(run)
    assert wb["config"]["stages"] == 2 and wb["config"]["split"] == ",".join(s["split_points"])
    assert wb["summary"]["speedup"] == pytest.approx(s["speedup"], rel=1e-6)
    assert wb["summary"]["throughput_ips"] == pytest.approx(s["throughput_ips"], rel=1e-6)
    assert [wb["history"][step]["pipeline/pass_ips"] for step in (0, 1)] == [pytest.approx(v) for _, v in passes]

    row = json.loads(proc.stdout)["rows"][0]  # the sweep itself: a step per point
    assert tensorboard_scalars(out / "tensorboard")["sweep/speedup"] == [(0, pytest.approx(row["speedup"]))]
    assert wandb_run(out)["summary"]["best/speedup"] == pytest.approx(row["speedup"])

    # A past run, tracked afterwards from its record alone, gives the same figures.
    shutil.rmtree(run / "tensorboard")
    again = run_pictl(["track", str(run), "--to", "tensorboard"], env)
    assert again.returncode == 0 and again.stdout.strip() == f"tensorboard: {run / 'tensorboard'}", again.stderr
    assert tensorboard_scalars(run / "tensorboard") == tb


@pytest.mark.slow
def test_a_training_job_reads_back_from_tensorboard_and_wandb(tmp_path: Path, env: dict[str, str]) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = run_pictl(["train", "--hosts", str(hosts), "--out", str(tmp_path / "trains"), *TINY, "--mode",
                      "pipeline", "--batch-size", "8", "--chunks", "2", "--steps", "4", "--train-images", "32",
                      "--eval-images", "16", "--check-steps", "0", "--no-save", *BOTH, "--json"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    job = Path(s["job_dir"])
    tb = tensorboard_scalars(job / "tensorboard")
    assert tb["train/loss"] == [(p["step"], pytest.approx(p["loss"], rel=1e-6)) for p in s["losses"]]
    assert len(s["losses"]) == 4 and tb["samples_per_s"] == [(0, pytest.approx(s["samples_per_s"], rel=1e-6))]
    assert tb["train/top1"][-1][1] == pytest.approx(s["top1"], rel=1e-6)
    for row in s["breakdown"]:
        assert tb[f"rank{row['rank']}/forward_ms"] == [(0, pytest.approx(row["per_step_ms"]["forward"], rel=1e-6))]
    wb = wandb_run(job)
    assert wb["config"]["mode"] == "pipeline" and wb["config"]["batch_size"] == 8
    assert [wb["history"][p["step"]]["train/loss"] for p in s["losses"]] == [pytest.approx(p["loss"])
                                                                              for p in s["losses"]]


@pytest.mark.parametrize("args, inventory, says", [
    (["--track", "mlflow"], "", "'mlflow' is not one of"),
    ([], "track = 5\n", "cluster.track"),
    ([], 'track = ["tensorboard", "neptune"]\n', "cluster.track"),
])
def test_a_tracker_that_is_not_one_is_refused_before_anything_runs(tmp_path: Path, pictl_env, args: list[str],
                                                                   inventory: str, says: str) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    hosts.write_text(hosts.read_text().replace('name = "test"\n', f'name = "test"\n{inventory}', 1))
    proc = run_pictl(["run", "--hosts", str(hosts), "--headless", *args], pictl_env)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
