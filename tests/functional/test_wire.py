"""`--wire`: formats parsed and sized, each round trip within its documented error on real DeiT-S
activations, `balanced` sizing cuts by the format, and real runs: bytes per format, agreement, refusal.
The two real runs are also the records `pictl runs` and the plain headless output are tested on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from support.cli import finished, run_pictl
from support.clusters import write_cluster

from pictl.planning.costs import Profiles, cost_table
from remote.floor.balance import Link, balanced_split
from remote.floor.spec import RunSpec
from remote.floor.wire import FP32, WireFormat, byte_ratio, parse_format, parse_wire
from remote.toolkit.codec import decode, encode, payload_meta
from remote.toolkit.stage import build_stage, layout_for


def test_wire_texts_parse_or_name_the_bad_part() -> None:
    assert parse_wire("int8") == parse_wire(" int8 ") and parse_wire("int8").default == WireFormat("int8")
    mixed = parse_wire("int8,blocks.4=fp16")
    assert mixed.at("blocks.4") == WireFormat("fp16") and mixed.at("blocks.8") == WireFormat("int8")
    only = parse_wire("blocks.4=lowrank:8")
    assert only.at("blocks.4") == WireFormat("lowrank", 8) and only.at("blocks.9") == FP32
    assert str(only) == "blocks.4=lowrank:8" and not only.lossless and parse_wire("fp32").lossless
    for bad, said in (("int4", "not a wire format"), ("lowrank:0", "rank must be"), ("lowrank", "not a wire"),
                      ("fp16,int8", "more than one format"), ("blocks.4=fp16,blocks.4=int8", "given twice"),
                      ("a b=fp16", "not a module name"), ("fp16,", "empty part"), ("", "no wire format"),
                      ("convinsert:0", "between 0 and 1"), ("convinsert:1.5", "between 0 and 1"),
                      ("convinsert", "not a wire format")):
        with pytest.raises(ValueError, match=said):
            parse_wire(bad)
    assert byte_ratio(parse_format("fp16")) == 0.5 == byte_ratio(parse_format("bf16"))
    assert str(parse_format("convinsert:0.25")) == "convinsert:0.25" == str(parse_format("convinsert:.25"))
    assert byte_ratio(parse_format("convinsert:0.25")) == 96 / 384  # round(384 x 0.25) of DeiT-S's channels
    assert byte_ratio(parse_format("int8")) == pytest.approx(0.25 + 1 / 384)  # a scale per 384 channels
    assert byte_ratio(parse_format("lowrank:8")) == pytest.approx(8 * (197 + 384) / (197 * 384))


@pytest.fixture(scope="module")
def activations() -> tuple[torch.Tensor, torch.Tensor]:
    """What DeiT-S (seeded weights) sends at an in-block cut for 2 images: the state and its residual."""
    spec = RunSpec(stages=2, policy="explicit", split_points=["blocks.5.attn.proj"], chunk=2)
    layout = layout_for(spec)
    stage = build_stage(spec, layout, layout.stages[0], None)
    torch.manual_seed(0)
    with torch.no_grad():
        out = stage(torch.randn(2, 3, 224, 224))
    assert isinstance(out, tuple) and len(out) == 2 and out[0].shape == (2, 197, 384)
    return out


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bf16", "int8", "lowrank:16"])
def test_each_format_round_trips_within_its_documented_error(fmt: str, activations) -> None:
    f = parse_format(fmt)
    payload = encode(f, activations)
    metas = payload_meta(f, [t.shape for t in activations])
    assert [(p.shape, p.dtype) for p in payload] == [(m.shape, m.dtype) for m in metas]  # what the schedule expects
    assert sum(p.numel() * p.element_size() for p in payload) == sum(f.payload_bytes(tuple(t.shape))
                                                                     for t in activations)
    back = decode(f, payload)
    for x, y in zip(activations, back, strict=True):
        assert y.dtype == torch.float32 and y.shape == x.shape
        err = (x - y).abs()
        if fmt == "fp32":
            assert torch.equal(x, y)
        elif fmt in ("fp16", "bf16"):  # relative rounding of the format: 2^-11 and 2^-8
            bound = 2.0 ** (-11 if fmt == "fp16" else -8)
            assert (err <= bound * x.abs() + 1e-6).all()
        elif fmt == "int8":  # half a quantisation step of each token's own scale
            step = x.abs().amax(dim=-1, keepdim=True) / 127
            assert (err <= step / 2 + 1e-6).all()
        else:  # power iteration gets near the best rank-16 approximation (the truncated SVD)
            s = torch.linalg.svdvals(x)
            best = s[..., 16:].pow(2).sum(-1).sqrt()
            assert (torch.linalg.matrix_norm(x - y) <= 1.25 * best).all()


def test_balanced_sizes_each_cut_by_the_wire() -> None:
    """A slow link: in fp32, the in-block cut (state and residual: twice the bytes) is too slow, so the split
    takes an uneven block boundary; under int8 the balanced in-block cut fits the link."""
    host = {"compute_s": [0.05] * 4, "comm_s_per_byte": 0.0, "cut_bytes": [0.0, 4e5, 8e5, 4e5], "piece_bytes": []}
    profiles = Profiles({"a": host, "b": host}, [], [])
    links = {("a", "b"): Link(0.0, 5e6)}
    exact = balanced_split(cost_table(["a", "b"], profiles, links))
    packed = balanced_split(cost_table(["a", "b"], profiles, links, wire_ratio=byte_ratio(parse_format("int8"))))
    assert exact.starts in ((1,), (3,)) and exact.bottleneck_s == pytest.approx(0.15)
    assert packed.starts == (2,) and packed.bottleneck_s == pytest.approx(0.10)
    assert packed.link_s[0] == pytest.approx(8e5 * byte_ratio(parse_format("int8")) / 5e6)


def test_bad_wire_input_is_refused_before_anything_starts(tmp_path: Path, pictl_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    for args, said in ((["--wire", "int4"], "--wire: 'int4' is not a wire format"),
                       (["--wire", "blocks.6=fp16"], "per-cut formats (blocks.6) need explicit split points"),
                       (["--split", "blocks.6", "--wire", "blocks.5=fp16"], "blocks.5 is not a cut of this run"),
                       (["--wire", "int8", "--min-agreement", "1.5"], "--min-agreement"),
                       (["--wire", "convinsert:0.1"], "convinsert is a compressor learned in training")):
        proc = run_pictl(["run", "--hosts", str(hosts), "--stages", "2", "--headless", *args], pictl_env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert said in proc.stderr.strip().splitlines()[-1], (args, proc.stderr)
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def wire_runs(tmp_path_factory) -> dict:
    """Two real runs in one runs directory, the second reusing the first's serial baseline: 3 stages with an
    fp16 and an int8 cut, then 2 stages with lowrank:1 (far below the agreement threshold). They are also the
    records `pictl runs` is tested on, and their output is read as a narrow non-terminal would get it."""
    root = tmp_path_factory.mktemp("wire")
    hosts = write_cluster(root / "cluster", 3)
    env = {**os.environ, "PICTL_RUNS_DIR": str(root / "runs"), "PICTL_CACHE_DIR": str(root / "cache"),
           "COLUMNS": "40"}
    common = ["run", "--hosts", str(hosts), "--images", "6", "--chunk", "2", "--warmup", "0", "--repeats", "1",
              "--headless", "--json"]
    procs = [run_pictl([*common, "--stages", "3", "--split", "blocks.4,blocks.8.attn.proj",
                        "--wire", "blocks.4=fp16,blocks.8.attn.proj=int8"], env),
             run_pictl([*common, "--stages", "2", "--split", "blocks.6", "--wire", "lowrank:1"], env)]
    return {"env": env, "procs": procs, "summaries": [json.loads(p.stdout) for p in procs]}


@pytest.mark.slow
def test_a_real_run_sends_half_with_fp16_and_a_quarter_with_int8(wire_runs, tmp_path: Path) -> None:
    proc, s = wire_runs["procs"][0], wire_runs["summaries"][0]
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    err = proc.stderr
    first, second = s["wire"]["links"]
    assert (first["cut"], first["format"], second["cut"], second["format"]) == (
        "blocks.4", "fp16", "blocks.8.attn.proj", "int8")
    # 3 microbatches of 2 images of 197x384 fp32; the in-block cut also sends the residual.
    raw = 3 * 2 * 197 * 384 * 4
    assert first["raw_bytes"] == raw and first["wire_bytes"] == raw // 2
    assert second["raw_bytes"] == 2 * raw and second["wire_bytes"] == 2 * (raw // 4 + 3 * 2 * 197 * 4)
    assert s["per_stage"][0]["bytes_sent"] == first["wire_bytes"] and first["compress_s"] > 0
    assert second["decompress_s"] > 0 and first["avg_Bps"] > 0 and first["peak_Bps"] >= first["avg_Bps"]
    assert s["wire"]["lossy"] is True and s["compared_images"] == 6  # judged over every image
    assert s["outputs_match"] is True and s["agreement"] >= 0.99 and 0 < s["mean_abs_diff"] < 0.1
    assert "lossy wire blocks.4=fp16,blocks.8.attn.proj=int8: top-1 agreement" in err
    assert "link 0->1 at blocks.4: fp16" in err
    report = run_pictl(["report", s["run_id"][:-2], "--out", str(tmp_path / "report")], wire_runs["env"])
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "**lossy wire** `blocks.4=fp16,blocks.8.attn.proj=int8`" in text
    assert "| 1->2 | blocks.8.attn.proj | int8 |" in text
    assert (tmp_path / "report" / f"{s['run_id']}-wire.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_lossy_run_below_the_agreement_threshold_fails_with_exit_5(wire_runs) -> None:
    proc, s = wire_runs["procs"][1], wire_runs["summaries"][1]
    assert proc.returncode == 5, proc.stderr[-3000:]
    # The first run's baseline is reused unless it no longer stands (on a machine other work loads, a baseline
    # measured under that load is measured again, and says why): either way the lossy run is judged against it.
    why = s["baseline"]["not_reused_because"] or ""
    assert s["serial_reused"] is True or why.startswith(("the cached baseline was suspect", "the host changed")), why
    assert s["status"] == "failed" and s["outputs_match"] is False and s["agreement"] < 0.99
    assert s["wire"]["links"][0]["ratio"] < 0.01
    assert proc.stderr.strip().splitlines()[-1].startswith("pictl: error: lossy wire (lowrank:1): top-1 agreement")
    assert json.loads((Path(s["run_dir"]) / "summary.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_headless_output_on_a_non_terminal_is_plain_one_line_per_event(wire_runs) -> None:
    err = wire_runs["procs"][0].stderr  # COLUMNS=40, stderr a pipe
    assert "[dim]" not in err and "[/]" not in err and "[bold" not in err and "\x1b[" not in err
    lines = err.splitlines()
    passes = [line for line in lines if line.startswith("pictl pipeline: pass ")]
    assert passes and all(line.endswith(" img/s") for line in passes)
    assert max(len(line) for line in lines if line.startswith(("pictl ", "link "))) > 40  # not wrapped


@pytest.mark.slow
def test_runs_lists_shows_compares_and_exports_real_runs(wire_runs, tmp_path: Path) -> None:
    env = wire_runs["env"]
    first, second = wire_runs["summaries"]
    listed = json.loads(run_pictl(["runs", "--json"], env).stdout)
    assert [r["run_id"] for r in listed] == [second["run_id"], first["run_id"]]  # newest first
    assert listed[0]["status"] == "failed" and listed[0]["wire"] == "lowrank:1 (lossy wire)"
    assert listed[1]["split"] == "blocks.4,blocks.8.attn.proj" and listed[1]["baseline"] == "measured"
    by_stages = json.loads(run_pictl(["runs", "--json", "--sort", "stages"], env).stdout)
    assert [r["stages"] for r in by_stages] == [3, 2]
    assert [r["run_id"] for r in json.loads(run_pictl(["runs", "--json", "--status", "failed"], env).stdout)] == [
        second["run_id"]]
    assert json.loads(run_pictl(["runs", "--json", "--stages", "4"], env).stdout) == []
    assert len(json.loads(run_pictl(["runs", "--json", "--since", "2000-01-01"], env).stdout)) == 2
    bad = run_pictl(["runs", "--since", "yesterday"], env)
    assert bad.returncode == 2 and "--since: 'yesterday' is not a date" in bad.stderr

    compare = run_pictl(["runs", "compare", first["run_id"], second["run_id"][:-2]], env)  # an id prefix works
    assert compare.returncode == 0, compare.stderr
    cells = {row[0]: row[1:] for row in ([c.strip() for c in line.split("│") if c.strip()]
                                         for line in compare.stdout.splitlines()) if row}
    # (the first run's result is SUSPECT where other work slowed one of its measurements: its verdict, shown)
    shown_status = "suspect" if first.get("verdict") == "suspect" else "ok"
    assert cells["stages"] == ["3", "2"] and cells["status"] == [shown_status, "failed"], cells
    rows = json.loads(run_pictl(["runs", "compare", first["run_dir"], second["run_id"], "--json"], env).stdout)
    assert [r["speedup"] for r in rows] == [first["speedup"], second["speedup"]]  # as the summary holds it
    one = run_pictl(["runs", "compare", first["run_id"]], env)
    assert one.returncode == 2 and "two runs or more" in one.stderr

    shown = run_pictl(["runs", "show", first["run_id"], "--json"], env)
    assert json.loads(shown.stdout)["run_id"] == first["run_id"]
    assert run_pictl(["runs", "show", "nope"], env).returncode == 2

    csv_path = tmp_path / "runs.csv"
    exported = run_pictl(["runs", "export", "--csv", str(csv_path)], env)
    assert exported.returncode == 0, exported.stderr
    header, *body = csv_path.read_text().splitlines()
    assert header.startswith("run_id,started,status,model,stages,policy") and len(body) == 2
