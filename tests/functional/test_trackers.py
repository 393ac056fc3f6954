"""`--track tensorboard` and `--track wandb`: a sweep, its run and a training job written to both trackers
read back with the trackers' own readers hold the figures their summaries hold; `pictl track` writes a past
run the same way; a tracker that is not one, in a flag or in the inventory, is refused before anything runs.
What a tracker cannot take is one line and a documented code, never a traceback: a host's malformed value is
left out with a note, a `PICTL_WANDB_*` value W&B would refuse (or one pictl does not read) and a file where
the tracker's folder goes are exit 2 with nothing written, a tracker that fails to write (a full disk) exit 9
with nothing of it left, and W&B's `disabled` mode says it wrote nothing."""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import ROOT, run_pictl
from support.clusters import write_cluster
from support.disks import fill, small_tmpfs
from support.forked import PictlServer
from support.trackers import tensorboard_hparams, tensorboard_scalars, wandb_run

TINY = ["--model", "vit_tiny_patch16_224", "--model-arg", "img_size=32", "--model-arg", "patch_size=8",
        "--model-arg", "depth=2", "--model-arg", "embed_dim=96", "--model-arg", "num_heads=4"]
BOTH = ["--track", "tensorboard", "--track", "wandb"]


@pytest.fixture(scope="module")
def forks(tmp_path_factory) -> Iterator[PictlServer]:
    """The short commands (refused, or a past run tracked) as processes forked from one that imported pictl once
    (`support.forked`): each spent most of its second importing. W&B's variables are each command's own: the
    server imports neither tracker."""
    server = PictlServer(tmp_path_factory.mktemp("forks"), {**os.environ, "COLUMNS": "200"}, command_env=("WANDB_",))
    yield server
    server.close()


@pytest.fixture
def env(pictl_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    # W&B keeps settings of its own in the home directory: the test's stay in its own.
    return {**pictl_env, "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


@pytest.mark.slow
def test_a_sweep_and_its_run_read_back_from_tensorboard_and_wandb(tmp_path: Path, env: dict[str, str],
                                                                 forks: PictlServer) -> None:
    hosts, out = write_cluster(tmp_path / "cluster", 2), tmp_path / "sweep"
    # (32 images: the pipeline's passes last a few seconds even on a quiet machine, so the run's host monitor,
    # every 2 s, reads at least one CPU figure; its baseline is the sweep's reference, measured apart)
    proc = run_pictl(["sweep", "--hosts", str(hosts), "--out", str(out), "--stages", "2", "--images", "32",
                      "--warmup", "0", "--repeats", "2", "--rounds", "1", "--max-rounds", "1", *BOTH, "--json"], env,
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "track: tensorboard:" in proc.stderr and "track: wandb:" in proc.stderr
    run = Path(env["PICTL_RUNS_DIR"]) / json.loads(proc.stdout)["rows"][0]["run_id"]  # (its runs: under the runs root)
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
    assert hparams["stages"] == 2 and hparams["split"] == ",".join(s["split_points"]) and hparams["images"] == 32

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
    again = forks.run(["track", str(run), "--to", "tensorboard"], env)
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


@pytest.mark.parametrize("args, inventory, variables, says", [
    (["--track", "mlflow"], "", {}, "'mlflow' is not one of"),
    ([], "track = 5\n", {}, "cluster.track"),
    ([], 'track = ["tensorboard", "neptune"]\n', {}, "cluster.track"),
    (["--track", "wandb"], "", {"PICTL_WANDB_MODE": "onlin"}, "PICTL_WANDB_MODE: 'onlin' is not one of"),
])
def test_a_tracker_that_is_not_one_is_refused_before_anything_runs(tmp_path: Path, pictl_env, args: list[str],
                                                                   inventory: str, variables: dict[str, str],
                                                                   says: str, forks: PictlServer) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    hosts.write_text(hosts.read_text().replace('name = "test"\n', f'name = "test"\n{inventory}', 1))
    proc = forks.run(["run", "--hosts", str(hosts), "--headless", *args], {**pictl_env, **variables})
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def _past_run(tmp_path: Path, samples: list[dict[str, object]]) -> Path:
    """A finished run's record (the shipped two-stage summary) with the host samples a run being tracked keeps."""
    run = tmp_path / "runs" / "20261124-100000-s2-track"
    run.mkdir(parents=True)
    summary = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "run_id": run.name, "run_dir": str(run)}))
    (run / "config.json").write_text("{}")
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run


def test_a_hosts_malformed_values_are_left_out_with_a_note(tmp_path: Path, env: dict[str, str],
                                                           forks: PictlServer) -> None:
    """A host's throttling value that is no bit mask (a Pi's vcgencmd answering garbage) ended `pictl track`
    in an internal error: it is left out, said once for the file, and every other figure is written."""
    run = _past_run(tmp_path, [{"host": "h0", "at": 1.0, "cpu_pct": 12.5, "throttled": "0xZZ"},
                               {"host": "h0", "at": 2.0, "cpu_pct": "busy", "throttled": "0x50005"},
                               {"host": "h1", "at": 1.0, "cpu_pct": 30.0, "throttled": "0x0"}])
    proc = forks.run(["track", str(run), "--to", "tensorboard"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == (f"pictl: note: {run}/samples.jsonl: 2 malformed host value(s) left out (the first: "
                                   "host 'h0' throttled '0xZZ')")
    tb = tensorboard_scalars(run / "tensorboard")
    assert tb["host/h0/cpu_pct"] == [(0, 12.5)] and tb["host/h0/throttled"] == [(1, 1.0)]
    assert tb["host/h1/cpu_pct"] == [(0, 30.0)] and tb["host/h1/throttled"] == [(0, 0.0)]
    assert tb["speedup"] and proc.stdout.strip() == f"tensorboard: {run / 'tensorboard'}"


@pytest.mark.parametrize("to, variables, blocker, says", [
    ("tensorboard", {}, "tensorboard", "tensorboard: not written: {run}/tensorboard is not a directory"),
    ("wandb", {}, "wandb", "wandb: not written: {run}/wandb is not a directory"),
    ("wandb", {"PICTL_WANDB_MODE": "bogus"}, None, "PICTL_WANDB_MODE: 'bogus' is not one of offline, online, disabled"),
    ("wandb", {"PICTL_WANDB_PROJECT": "lab/6"}, None, "PICTL_WANDB_PROJECT: 'lab/6' is not a W&B project name"),
    ("wandb", {"PICTL_WANDB_MDOE": "online"}, None, "PICTL_WANDB_MDOE: not a variable pictl reads"),
])
def test_pictl_track_refuses_what_a_tracker_cannot_take_in_one_line(tmp_path: Path, env: dict[str, str], to: str,
                                                                    variables: dict[str, str], blocker: str | None,
                                                                    says: str, forks: PictlServer) -> None:
    """Each of these was an internal error (exit 1, a traceback in the log): now exit 2 and one line naming the
    file or the variable, and nothing of either tracker written (both asked: neither is half there)."""
    run = _past_run(tmp_path, [])
    if blocker:
        (run / blocker).write_text("")
    other = "wandb" if to == "tensorboard" else "tensorboard"
    proc = forks.run(["track", str(run), "--to", other, "--to", to], {**env, **variables})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pictl: error: {says.format(run=run)}") and not proc.stdout, \
        proc.stderr
    assert sorted(p.name for p in run.iterdir()) == sorted(["config.json", "samples.jsonl", "summary.json",
                                                            *([blocker] if blocker else [])])


def test_wandb_disabled_says_it_wrote_nothing(tmp_path: Path, env: dict[str, str], forks: PictlServer) -> None:
    run = _past_run(tmp_path, [])
    proc = forks.run(["track", str(run), "--to", "wandb"], {**env, "PICTL_WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "wandb: nothing written (PICTL_WANDB_MODE=disabled)"
    assert not (run / "wandb").exists()


@pytest.mark.parametrize("to", ["tensorboard", "wandb"])
def test_a_tracker_that_cannot_write_is_one_line_exit_9_and_leaves_nothing(tmp_path: Path, env: dict[str, str],
                                                                          to: str, forks: PictlServer) -> None:
    """The record sits on a full disk: the tracker's own library fails (W&B's logging, TensorBoard's writer
    thread); what it made is removed and the failure is one line, exit 9, no traceback."""
    with small_tmpfs(tmp_path / "small") as disk:
        run = _past_run(disk, [])
        fill(disk)
        proc = forks.run(["track", str(run), "--to", to], env, timeout=120)
        assert proc.returncode == 9, proc.stderr[-3000:]
        assert proc.stderr.strip() == f"pictl: error: {to}: not written to {run / to} (OSError: [Errno 28] No space " \
                                      "left on device)"
        assert sorted(p.name for p in run.iterdir()) == ["config.json", "samples.jsonl", "summary.json"]
