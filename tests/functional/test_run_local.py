"""Real runs through the CLI on a local cluster: real torchrun, real gloo, real processes."""

from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from support.cifar import write_cifar10
from support.cli import finished, run_pictl
from support.clusters import write_cluster
from support.typed import untyped

from pictl.figure_text import energy_text, speedup_text
from pictl.summary_models import RunSummary

pytestmark = pytest.mark.slow
RECORDED_VCGENCMD = Path(__file__).resolve().parents[1] / "support" / "data" / "vcgencmd"

# Small passes keep each run short; the protocol stays the real one.
# `--policy equal` unless a test says otherwise: profiling costs for `balanced` is tested in test_balanced.
FAST = ["--images", "5", "--chunk", "2", "--warmup", "0", "--repeats", "1", "--headless", "--json", "--policy", "equal"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """One cluster and one baseline cache for the module, so later runs reuse the serial baseline."""
    root = tmp_path_factory.mktemp("run")
    return {"hosts": write_cluster(root / "cluster", 3), "root": root}


REQUIRED = {"status", "stages", "split_points", "throughput_ips", "serial_ips", "speedup", "outputs_match",
            "max_abs_diff", "accuracy", "run_dir", "per_stage"}
STAGE_KEYS = {"host", "rank", "modules", "params", "compute_s", "wait_s", "send_s", "bytes_sent", "peak_rss_mb"}


def _env(shared: dict, pictl_env: dict[str, str]) -> dict[str, str]:
    return {**pictl_env, "PICTL_CACHE_DIR": str(shared["root"] / "cache"),
            "PICTL_RUNS_DIR": str(shared["root"] / "runs")}


def _reused(s: dict) -> bool:
    """Whether the cached serial baseline stood for run `s`. On a machine other work loads it may not, and
    rightly: a baseline that was suspect when it was measured, or whose host changed since, is measured again,
    and the run says why. Either way holds; which one depends on the machine, not on pictl."""
    if s["serial_reused"]:
        return True
    why = s["baseline"]["not_reused_because"] or ""
    assert why.startswith(("the cached baseline was suspect when it was measured", "the host changed since")), why
    return False


def _run(shared: dict, env: dict[str, str], *args: str) -> dict:
    return _run_with_stderr(shared, env, *args)[0]


def _run_with_stderr(shared: dict, env: dict[str, str], *args: str) -> tuple[dict, str]:
    """A run of the module's protocol (FAST) on its cluster: its summary, and what it said on stderr. The latest
    fp32 one is kept (`shared["latest_fp32"]`): its serial run is the module's cached baseline as it stands now."""
    proc = run_pictl(["run", "--hosts", str(shared["hosts"]), *FAST, *args], env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    if "--numerics" not in args and "--fresh-baseline" not in args:
        shared["latest_fp32"] = s
    return s, proc.stderr


def test_two_stages_at_a_block_boundary(shared, pictl_env) -> None:
    s, err = _run_with_stderr(shared, _env(shared, pictl_env), "--stages", "2", "--split", "blocks.6")
    assert REQUIRED <= set(s) and all(STAGE_KEYS <= set(st) for st in s["per_stage"])
    assert s["status"] == "ok" and s["split_points"] == ["blocks.6"]
    assert s["outputs_match"] is True and s["max_abs_diff"] == 0.0 and s["compared_images"] == 5
    assert s["serial_reused"] is False and s["accuracy"] is None and s["plan_reused"] is False
    assert s["speedup"] == pytest.approx(s["throughput_ips"] / s["serial_ips"], rel=1e-3)
    st0, st1 = s["per_stage"]
    assert (st0["host"], st1["host"]) == ("h0", "h1")
    assert st0["modules"][0] == "patch_embed" and st0["modules"][-1] == "blocks.5"
    assert st1["modules"][0] == "blocks.6" and st1["modules"][-1] == "head"
    assert st0["params"] + st1["params"] == 22_050_664
    # 3 microbatches of 2 (the last padded) of 197x384 fp32 activations leave stage 0.
    assert st0["bytes_sent"] == 3 * 2 * 197 * 384 * 4 and st1["bytes_sent"] == 0
    assert st1["wait_s"] > 0 and st0["compute_s"] > 0
    run_dir = Path(s["run_dir"])
    assert json.loads((run_dir / "summary.json").read_text()) == s
    assert untyped(RunSummary.model_validate(s)) == []  # every key the run wrote has its type in the model
    events = [json.loads(line) for line in (run_dir / "events" / "h1.jsonl").read_text().splitlines()]
    assert {"run_start", "stage_ready", "progress", "throughput", "run_end"} <= {e["event"] for e in events}
    # The first run plans in the serial-baseline process (one torch import on h0): the plan comes first,
    # kept in the record although it arrived before the record existed.
    serial = [json.loads(line) for line in (run_dir / "events" / "serial.jsonl").read_text().splitlines()]
    assert [e["event"] for e in serial[:2]] == ["plan", "run_start"]
    assert json.loads((run_dir / "config.json").read_text())["plan"]["split_points"] == ["blocks.6"]
    # No meter on the PATH (this machine's own, where it has none): energy n/a, the host named (with the recorded
    # Pi 5 meter on the PATH: test_energy_per_image_from_a_pi5s_meter).
    if not _power_meter_here():
        none = RunSummary.model_validate(s).energy
        assert none is not None and none.pipeline_j_per_image is None and none.source is None
        assert none.pipeline_unmeasured == "host 'h0' has no power meter pictl can read"
        assert "  energy n/a" in err


def _repeated(shared: dict, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    """The first test's run again, as `make demo > log` runs it (plain output to a file, no --json): made once, for
    the two tests below (what it reuses, and how it prints). Its summary is the one in its run directory (the same
    document --json prints: test_two_stages_at_a_block_boundary)."""
    if "repeated" not in shared:
        proc = run_pictl(["run", "--hosts", str(shared["hosts"]), *[a for a in FAST if a != "--json"], "--stages", "2",
                          "--split", "blocks.6"], env)
        assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
        (run_dir,) = [line.removeprefix("run directory: ") for line in proc.stdout.splitlines()
                      if line.startswith("run directory: ")]
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        shared["repeated"], shared["latest_fp32"] = (proc, summary), summary
    return shared["repeated"]


def test_a_repeated_run_reuses_plan_and_baseline(shared, pictl_env) -> None:
    _, s = _repeated(shared, _env(shared, pictl_env))
    assert s["plan_reused"] is True and s["outputs_match"] is True
    assert s["split_points"] == ["blocks.6"] and s["per_stage"][1]["modules"][0] == "blocks.6"
    startup = s["startup"]
    parts = [v for k, v in startup.items() if k.endswith("_s") and k != "total_s"]
    assert startup["total_s"] == pytest.approx(sum(parts), abs=0.01)
    assert startup["plan_s"] < 1.0 and startup["torch_imports"] == 0  # the plan is cached: no process plans
    if _reused(s):
        # the hot path: the warm process the first test started forks the agents and ranks; nothing imports torch
        assert startup["baseline_s"] < 1.0 and startup["served_warm"] == {"launch": True}
    else:  # measured again, by a job forked warm like the launch's
        assert startup["served_warm"] == {"baseline": True, "launch": True}


def test_plain_output_to_a_file_is_never_wrapped_or_padded(shared, pictl_env) -> None:
    """`make demo > log`: the result is one line however long, and no line carries trailing spaces."""
    proc, _ = _repeated(shared, _env(shared, pictl_env))
    lines = proc.stdout.splitlines()
    word = "OK" if proc.returncode == 0 else "SUSPECT"  # (its serial baseline slowed by other work: `finished`)
    assert lines[0].startswith(f"{word}  2 stage(s)  split blocks.6  pipeline ") and "accuracy n/a" in lines[0], \
        lines[:2]
    assert not [line for line in lines if line != line.rstrip()], "padded lines"
    assert any(line.startswith("run directory: ") for line in lines)


def _power_meter_here() -> bool:
    """Whether this machine has a power meter pictl reads (a Pi's `vcgencmd`, or RAPL this user may read)."""
    return shutil.which("vcgencmd") is not None or any(
        os.access(p, os.R_OK) for p in glob.glob("/sys/class/powercap/intel-rapl:[0-9]/energy_uj"))


def test_energy_per_image_from_a_pi5s_meter(shared, pictl_env) -> None:
    """A recorded Raspberry Pi 5 `vcgencmd` first on the hosts' PATH: the PMIC rails' power over the pipeline's
    and the serial run's windows gives joules per image, in the summary and on the result line; the local hosts
    are one machine, so its meter counts once. (Without it the line says n/a: test_two_stages_at_a_block_boundary.)"""
    env = {**_env(shared, pictl_env), "PATH": f"{RECORDED_VCGENCMD}:{pictl_env.get('PATH', os.defpath)}"}
    # Windows of several sampling intervals (the run samples its hosts every 2 s): 24 images in 3 timed passes (one
    # pass of 24 at the ~19 img/s two stages reach here lasted 1.3 s, and ci38's held no sample). No untimed warm-up
    # pass: the power is a mean over the window and the joules per image divide it by the timed passes' rate, so a
    # cold first pass only lengthens the window.
    args = ["run", "--hosts", str(shared["hosts"]), "--images", "24", "--chunk", "1", "--warmup", "0",
            "--repeats", "3", "--policy", "equal", "--stages", "2", "--fresh-baseline", "--headless", "--json"]
    proc = run_pictl(args, env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = RunSummary.model_validate_json(proc.stdout)
    e = s.energy
    assert e is not None and e.source == "pmic" and e.machines == 1, e
    watts = 2.948  # the recorded rails: sum of volts x amps (tests/unit/test_energy.py computes it apart)
    assert e.pipeline_power_w == pytest.approx(watts, abs=1e-3) and e.serial_power_w == pytest.approx(watts, abs=1e-3)
    assert e.pipeline_j_per_image == pytest.approx(watts / (s.throughput_ips or 0), rel=2e-3)
    assert e.serial_j_per_image == pytest.approx(watts / (s.serial_ips or 0), rel=2e-3)
    line = proc.stderr.splitlines()[[i for i, x in enumerate(proc.stderr.splitlines())
                                     if x.startswith(("OK  ", "SUSPECT  "))][0]]
    assert f"energy {energy_text(e.pipeline_j_per_image, e.serial_j_per_image)}" in line, line
    assert "energy per image: " in proc.stderr and "(pmic, 1 machine(s))" in proc.stderr


def test_three_stages_inside_blocks_reuses_the_baseline(shared, pictl_env) -> None:
    s = _run(shared, _env(shared, pictl_env), "--stages", "3", "--split", "blocks.2.attn.proj,blocks.7.mlp.fc2")
    assert s["outputs_match"] is True and s["max_abs_diff"] == 0.0
    _reused(s)  # same model, data, protocol, threads and host as the first test: reused if it still stands
    assert [st["modules"][0] for st in s["per_stage"]] == ["patch_embed", "blocks.2.attn.proj", "blocks.7.mlp.fc2"]
    # An in-block cut sends the residual too: two tensors per microbatch.
    assert s["per_stage"][0]["bytes_sent"] == 3 * 2 * (2 * 197 * 384 * 4)


def test_int8_dynamic_numerics_beside_fp32(shared, pictl_env, tmp_path: Path) -> None:
    """--numerics int8-dynamic: the pipeline matches a serial run in int8 bit for bit; the fp32 serial run
    (the module's own baseline, reused: the same key) measures what int8 gains and what it costs."""
    env = _env(shared, pictl_env)
    # The fp32 run beside it: the module's latest (its serial run is the cached baseline this run's fp32 reference
    # key names: the same model, data, protocol and host); one of its own where this test runs alone.
    plain = shared.get("latest_fp32") or _run(shared, env, "--stages", "2", "--split", "blocks.6")
    proc = run_pictl(["run", "--hosts", str(shared["hosts"]), *FAST, "--stages", "2", "--split", "blocks.6",
                      "--numerics", "int8-dynamic"], env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert "numerics int8-dynamic (" in proc.stderr and "x over the fp32 serial run" in proc.stderr
    assert s["status"] == "ok" and s["outputs_match"] is True and s["max_abs_diff"] == 0.0
    assert untyped(RunSummary.model_validate(s)) == []
    n = s["numerics"]
    assert n["kind"] == "int8-dynamic" and len(n["engines"]) == 1 and n["engines"][0] in ("x86", "fbgemm", "qnnpack")
    if n["fp32_serial_reused"]:  # (the module's baseline, if it still stands: see _reused)
        assert n["fp32_serial_ips"] == plain["serial_ips"]
    assert n["serial_ips"] == s["serial_ips"] != n["fp32_serial_ips"]  # the same-numerics serial run is int8
    assert n["speedup_vs_fp32"] == pytest.approx(s["throughput_ips"] / n["fp32_serial_ips"], rel=1e-3)
    assert n["numerics_gain"] == pytest.approx(s["serial_ips"] / n["fp32_serial_ips"], rel=1e-3)
    assert s["speedup"] == pytest.approx(s["throughput_ips"] / s["serial_ips"], rel=1e-3)
    assert 0 <= n["agreement_vs_fp32"] <= 1 and n["mean_abs_diff_vs_fp32"] > 0 and n["compared_images"] == 5
    fp32 = (Path(s["run_dir"]) / "logits-serial-fp32.f32").read_bytes()
    assert fp32 == (Path(plain["run_dir"]) / "logits-serial.f32").read_bytes()
    assert (Path(s["run_dir"]) / "logits-serial.f32").read_bytes() != fp32
    report = run_pictl(["report", s["run_id"], "--out", str(tmp_path / "report")], env)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "**numerics** `int8-dynamic`" in text and f"**{speedup_text(n['speedup_vs_fp32'])}**" in text
    # The link from stage 0: its average over the timed passes, and its fastest pass read back from the
    # record's typed telemetry (a weighted mean of the passes' rates is never above the fastest).
    link = next(line for line in text.splitlines() if "(rank 0) -> rank 1 |" in line)
    average, fastest = (float(cell) for cell in link.strip("|").split("|")[1:3])
    assert 0 < average <= fastest
    # Serial only, nothing reused: the fp32 reference is measured too, after the run's own serial run.
    one = _run(shared, env, "--stages", "1", "--numerics", "int8-dynamic", "--fresh-baseline")
    n1 = one["numerics"]
    assert n1["fp32_serial_reused"] is False and n1["serial_ips"] == one["throughput_ips"]
    assert n1["speedup_vs_fp32"] == n1["numerics_gain"] and n1["agreement_vs_fp32"] == n["agreement_vs_fp32"]


def test_replicas_deal_the_images_and_every_replica_matches_the_serial_run(shared, pictl_env, tmp_path: Path,
                                                                          ) -> None:
    """--replicas: 2 copies of a 2-stage pipeline on 2 hosts of 2 slots, then 3 copies of the whole model on 3
    hosts; every replica's outputs gathered in image order and equal to the serial run's, bit for bit; the
    waterfall's ideal is every rank. Replicas x stages over the slots, or microbatches that do not divide
    among the replicas, are refused before anything starts."""
    env = _env(shared, pictl_env)
    two = write_cluster(tmp_path / "two", 2, slots=2)
    proc = run_pictl(["run", "--hosts", str(two), *FAST, "--images", "4", "--chunk", "1", "--stages", "2",
                      "--split", "blocks.6", "--replicas", "2"], env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["status"] == "ok" and s["replicas"] == 2 and s["outputs_match"] is True and s["max_abs_diff"] == 0.0
    assert untyped(RunSummary.model_validate(s)) == []
    assert s["compared_images"] == 4
    assert [(st["replica"], st["stage"], st["host"]) for st in s["per_stage"]] == [
        (0, 0, "h0"), (0, 1, "h0"), (1, 0, "h1"), (1, 1, "h1")]
    assert all(st["microbatches"] == 2 for st in s["per_stage"])  # 4 microbatches dealt, 2 to each replica
    assert s["per_stage"][0]["modules"][-1] == "blocks.5" and s["per_stage"][3]["modules"][0] == "blocks.6"
    assert s["efficiency"] == pytest.approx(s["speedup"] / 4, rel=1e-3)
    assert "2 replicas x 2 stage(s)" in proc.stderr and "(ideal 4x)" in proc.stderr
    # Each replica's own rate (2 images over its own pass) is at least the aggregate's half: the aggregate is
    # every image over the slowest replica's pass.
    each = s["replica_ips"]
    assert len(each) == 2 and min(each) == pytest.approx(s["throughput_ips"] / 2, rel=1e-3)
    assert max(each) >= min(each) and "img/s each; together" in proc.stderr
    w = s["waterfall"]
    assert w["stages"] == 4 and w["replicas"] == 2
    assert sum(t["points"] for t in w["terms"]) == pytest.approx(s["speedup"] - 4, abs=1e-3)

    whole = _run(shared, env, "--stages", "1", "--replicas", "3")  # 5 images of chunk 2: 3 microbatches
    assert whole["status"] == "ok" and whole["outputs_match"] is True and whole["max_abs_diff"] == 0.0
    assert [st["host"] for st in whole["per_stage"]] == ["h0", "h1", "h2"] and whole["throughput_ips"] > 0
    run_dir = Path(whole["run_dir"])
    assert (run_dir / "logits-pipeline.f32").read_bytes() == (run_dir / "logits-serial.f32").read_bytes()
    assert whole["wire"] is None and whole["latency"]["pipeline"]["microbatches"] == 1  # replica 0's one
    assert len(whole["replica_ips"]) == 3  # 2 + 2 + 1 images (the last microbatch short)

    for args, named in ((["--stages", "2", "--replicas", "3"], "3 replicas x 2 stages = 6 ranks do not fit"),
                        (["--stages", "1", "--replicas", "2"], "replicas: 2 replicas need the 3 microbatches")):
        bad = run_pictl(["run", "--hosts", str(shared["hosts"]), *FAST, *args], env)
        assert bad.returncode == 2 and named in bad.stderr, bad.stderr[-2000:]
        assert "Traceback" not in bad.stderr


def test_output_mismatch_fails_the_run(shared, pictl_env, tmp_path: Path) -> None:
    """A stale baseline whose logits differ (here: bytes flipped in the cache) must fail the run; on a machine
    other work loads, the cached baseline may rightly not stand at all, and the run measures its own."""
    env = {**_env(shared, pictl_env), "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    shutil.copytree(shared["root"] / "cache", tmp_path / "cache")
    for logits in (tmp_path / "cache").rglob("logits-serial.f32"):
        data = bytearray(logits.read_bytes())
        data[0:4] = struct.pack("<f", 1234.5)
        logits.write_bytes(bytes(data))
    proc = run_pictl(["run", "--hosts", str(shared["hosts"]), *FAST, "--stages", "2", "--split", "blocks.6"], env)
    s = json.loads(proc.stdout)
    if not _reused(s):  # never a false OK from the flipped bytes: they were not used
        assert finished(proc.returncode, proc.stderr) and s["outputs_match"] is True, proc.stderr[-2000:]
        return
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert s["status"] == "failed" and s["outputs_match"] is False and s["max_abs_diff"] > 1000
    assert untyped(RunSummary.model_validate(s)) == []  # a failed run's record too
    assert "differs from the serial run" in proc.stderr.strip().splitlines()[-1]
    assert json.loads((Path(s["run_dir"]) / "summary.json").read_text())["status"] == "failed"


def test_labelled_data_and_threads_0_on_one_host_of_two_slots(tmp_path: Path, pictl_env) -> None:
    """Accuracy from labelled data; and with `--threads 0`, 2 stages on one host of 2 slots: each rank
    gets half the host's cores, the serial run all of them."""
    import os

    hosts = write_cluster(tmp_path / "cluster", 1, slots=2)
    data = write_cifar10(tmp_path / "cifar", images=6)
    proc = run_pictl(["run", "--hosts", str(hosts), *FAST, "--stages", "2", "--threads", "0", "--data", "cifar10",
                      "--data-path", str(data), "--num-classes", "10"], pictl_env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    # A 10-class head is tiny, so half the parameters are reached a piece earlier than with 1000 classes.
    assert s["split_points"] == ["blocks.5.mlp.fc2"] and s["outputs_match"] is True
    assert s["accuracy"] is not None and 0.0 <= s["accuracy"] <= 1.0
    assert s["accuracy"] == s["serial_accuracy"]  # same logits, same labels
    cores = len(os.sched_getaffinity(0))
    assert [(st["host"], st["threads"]) for st in s["per_stage"]] == [("h0", max(1, cores // 2))] * 2
    assert f"h0: 2 stage(s) x {max(1, cores // 2)} thread(s)" in proc.stderr
    run_dir = Path(s["run_dir"])
    starts = [json.loads(line) for line in (run_dir / "events" / "h0.jsonl").read_text().splitlines()
              if '"run_start"' in line]
    assert sorted(e["threads"] for e in starts) == [max(1, cores // 2)] * 2  # what torch was set to, per rank
    serial = [json.loads(line) for line in (run_dir / "events" / "serial.jsonl").read_text().splitlines()
              if '"run_start"' in line]
    assert serial[0]["threads"] == cores
