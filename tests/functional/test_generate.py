"""`pictl generate` for real: a decoder-only transformer's layers pipelined over a local cluster by torchrun, its
token ids checked against the serial run's and against transformers' own `generate`, its figures against what
the stages sent, and bad cuts and oversized models refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import processes_under, write_cluster
from support.typed import untyped

from pictl.jobs.generation.figures import GenerateSummary
from pictl.jobs.generation.options import SIZES


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    return write_cluster(tmp_path_factory.mktemp("generate") / "cluster", 3)


def _generate(hosts: Path, env: dict[str, str], *args: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    proc = run_pictl(["generate", "--hosts", str(hosts), "--json", *args], env, 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert untyped(GenerateSummary.model_validate(summary)) == []  # every key the job wrote is typed
    return summary, proc


def _left_behind(hosts: Path) -> None:
    assert processes_under(hosts.parent) == []
    assert all((hosts.parent / f"h{i}" / "lease").read_text() == "" for i in range(3)
               if (hosts.parent / f"h{i}" / "lease").exists())


@pytest.mark.slow
def test_a_tiny_llama_in_int8_on_two_stages_generates_the_int8_serial_runs_tokens(cluster, pictl_env) -> None:
    """A Llama built from its configuration (8 layers of width 128, seeded weights), 2 stages, 18 sequences in flight,
    8 new tokens each, `--numerics int8-dynamic`: the ids are the int8 serial run's (an int8 stage is
    deterministic), their agreement with an fp32 serial run of the same prompts is measured (a bounded loss,
    reported), and the figures are what the stages did. (fp32 is held to the serial run and to transformers' own
    `generate` by the next test.)"""
    # 18 sequences: more than a bounded window of sends in flight once deadlocked 2 stages (the second waiting on
    # the first for a token, the first on the second to take a prompt).
    s, proc = _generate(cluster, pictl_env, "--arch", "llama", "--numerics", "int8-dynamic", "--stages", "2",
                        "--sequences", "18", "--new-tokens", "8", "--prompt-tokens", "8")
    assert s["status"] == "ok" and s["numerics"] == "int8-dynamic"
    assert s["tokens_identical"] is True and s["first_difference"] is None
    job = Path(s["job_dir"])
    serial = json.loads((job / "serial-tokens.json").read_text())["tokens"]
    pipeline = json.loads((job / "tokens.json").read_text())["tokens"]
    assert serial == pipeline and [len(t) for t in pipeline] == [8] * 18
    assert len({tuple(t) for t in pipeline}) > 1  # (several prompts, not one sequence many times)
    fp32 = json.loads((job / "serial-fp32-tokens.json").read_text())["tokens"]
    agree = s["agreement_fp32"]
    same = sum(a == b for x, y in zip(fp32, pipeline, strict=True) for a, b in zip(x, y, strict=True))
    assert agree["positions"] == 18 * 8 and agree["agree"] == same
    assert agree["share"] == pytest.approx(same / (18 * 8), abs=1e-4)
    assert s["speedup_fp32"] == pytest.approx(s["pipeline"]["tokens_per_s"] / s["serial_fp32"]["tokens_per_s"],
                                              rel=1e-3)
    starts = [json.loads(line) for f in job.glob("events/h*.jsonl") for line in f.read_text().splitlines()
              if '"gen_start"' in line]
    assert len(starts) == 2 and all(r["numerics"] == "int8-dynamic" and r["engine"] for r in starts)
    # `balanced`: the last stage's head (4096 x 128) weighs as much as 2.9 of the layers, so it gets 3 layers of 8.
    assert s["split"] == [5] and [(st["first_layer"], st["end_layer"]) for st in s["stage_figures"]] == [(0, 5), (5, 8)]
    assert s["pipeline"]["tokens"] == s["serial"]["tokens"] == 18 * 8 and s["engines_differ"] is None
    # What crossed each link, per token: the first stage sent each sequence's prompt (8 positions) once and one
    # position per later token, of width 128 in fp32; the last sent back one int64 id per token.
    hidden = SIZES["tiny"]["hidden_size"]
    first, last = s["stage_figures"]
    assert first["bytes_per_token"] == pytest.approx(4 * hidden * (8 + 7) / 8)
    assert last["bytes_per_token"] == 8
    assert s["speedup"] == pytest.approx(s["pipeline"]["tokens_per_s"] / s["serial"]["tokens_per_s"], rel=1e-3)
    # The waterfall explains the gap to N whole: its signed terms add up from 2 to the measured speedup.
    assert 2 + sum(t["points"] for t in s["waterfall"]) == pytest.approx(s["speedup"], abs=0.01)
    assert "token ids identical to the serial run's (int8-dynamic)" in proc.stderr
    assert "agreement with fp32" in proc.stderr
    _left_behind(cluster)


HF_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoConfig, AutoModelForCausalLM
    out, prompts = sys.argv[1], json.loads(sys.argv[2])
    config = AutoConfig.for_model("qwen2", num_hidden_layers=3, hidden_size=64, intermediate_size=160,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                  tie_word_embeddings=True)
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(out)
    tokens = []
    for p in prompts:
        ids = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, pad_token_id=0)
        tokens.append(ids[0, len(p):].tolist())
    print(json.dumps(tokens))
""")


@pytest.mark.slow
def test_a_saved_model_directory_gives_transformers_own_generate_tokens(cluster, pictl_env, tmp_path) -> None:
    """A Qwen2 model (tied embeddings) written by `save_pretrained`, cut after its second layer: the pipeline's ids
    are what transformers' `generate` gives on one process for the same prompts (a prompts file)."""
    prompts = [[5, 17, 300, 2], [9, 9, 41], [250, 3, 77, 12, 1], [400]]
    model = tmp_path / "qwen2-tiny"
    hf = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(model), json.dumps(prompts)], capture_output=True,
                        text=True, timeout=300)
    assert hf.returncode == 0, hf.stderr[-2000:]
    expected = json.loads(hf.stdout.strip().splitlines()[-1])
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    s, _ = _generate(cluster, pictl_env, "--model", str(model), "--stages", "2", "--split", "2",
                     "--prompts", str(tmp_path / "prompts.json"), "--new-tokens", "12")
    assert s["arch"] == "qwen2" and s["layers"] == 3 and s["sequences"] == 4 and s["prompt_tokens"] == [4, 3, 5, 1]
    assert json.loads((Path(s["job_dir"]) / "tokens.json").read_text())["tokens"] == expected
    assert s["tokens_identical"] is True
    _left_behind(cluster)


def test_bad_cuts_and_models_that_fit_no_host_are_refused_before_anything_starts(cluster, pictl_env,
                                                                                  pictl_forks) -> None:
    """Exit 2 with one line naming the flag, the model and what would do; no job directory, nothing on a host.
    (Each a `pictl generate` process of its own, forked from one that imported pictl once: `support.forked`.)"""
    runs = Path(pictl_env["PICTL_RUNS_DIR"]).parent / "generations"
    cases = {
        ("--split", "9"): "--split 9: cuts are decoder layers in increasing order between the first and the last "
                          "(llama (tiny)'s valid cuts: 1..7)",
        ("--stages", "3", "--split", "4,4"): "--split 4,4: cuts are decoder layers in increasing order",
        ("--stages", "3", "--split", "4"): "--split 4: 3 stages need 2 cut(s)",
        ("--layers", "2", "--stages", "3"): "--stages 3: llama (tiny, 2 layers) has 2 decoder layer(s)",
        ("--size", "qwen2.5-0.5b", "--layers", "1000"): "does not fit host 'h0'",
        # Weights of a few MB, but 256 sequences' KV caches to their 8192th token: 256 x 8200 x 16 KB = 32 GB a stage
        ("--layers", "64", "--stages", "2", "--sequences", "256", "--new-tokens", "8192"): "weights and KV caches",
        ("--model", "models/mine"): "--model models/mine: give the model directory's absolute path on the hosts",
        ("--model", "/nonexistent/model"): "--model /nonexistent/model: no config.json readable on host 'h0'",
    }
    for args, said in cases.items():
        proc = pictl_forks.run(["generate", "--hosts", str(cluster), *args], pictl_env, 120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("pictl: error: "), (args, proc.stderr)
        assert said in lines[0], (args, lines[0])
        assert "Traceback" not in proc.stderr
    assert not runs.exists() or not any(runs.iterdir())
    _left_behind(cluster)


def test_the_python_api_refuses_what_the_cli_refuses(cluster, pictl_env, monkeypatch) -> None:
    """`pictl.generate` takes the command's path: its options checked, the same cut refused before anything starts."""
    import pictl
    from pictl import errors as E

    monkeypatch.setenv("PICTL_RUNS_DIR", pictl_env["PICTL_RUNS_DIR"])
    with pytest.raises(E.ConfigError, match="valid cuts: 1..7"):
        pictl.generate(pictl.load_cluster(cluster), stages=2, split=[9])
    with pytest.raises(E.ConfigError, match="sequences"):
        pictl.generate(pictl.load_cluster(cluster), sequences=0)
    _left_behind(cluster)
