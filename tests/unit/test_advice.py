"""Advice that fits the run: what would reduce the dominant waterfall term, worded from the run's own options.

The figures are a real run's (`data/run_summary_two_stages.json`: 2 stages of DeiT-S on the local cluster, an
explicit split, chunk 1), changed only where a test makes one term dominate; the waterfall and its advice are
computed from them as a run computes them (`pictl.run.waterfall`)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from support.cli import ROOT

from pictl.run.waterfall import waterfall

REAL: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
TOTALS = ("compute_s", "wait_s", "send_s", "recv_post_s", "recv_wait_s", "first_wait_s", "send_post_s", "drain_s",
          "run_delay_s", "pass_s", "compress_s", "decompress_s")


def _run(**options: Any) -> dict[str, Any]:
    """The real run with `options`, its serial run as fast as its stages' compute added up (this run's stages
    took 179 ms an image together against the serial run's 114: split overhead, which would dominate every
    case) and its speedup what its img/s make of that."""
    s = copy.deepcopy(REAL)
    s.update(options)
    per = s["images"] * s["repeats"]
    s["serial_ips"] = round(per / sum(st["compute_s"] for st in s["per_stage"]), 4)
    s["speedup"] = round(s["throughput_ips"] / s["serial_ips"], 4)
    return s


def _imbalanced(policy: str, **options: Any) -> dict[str, Any]:
    """Rank 0 computes a third of what it did: the split leaves rank 1 the bottleneck."""
    s = _run(policy=policy, **options)
    s["per_stage"][0]["compute_s"] /= 3
    return s


def _few_microbatches(images: int, chunk: int) -> dict[str, Any]:
    """The same per-image figures over fewer images (every total scaled), so filling and draining dominate: the
    pipeline ran at 97 % of what they allow."""
    s = copy.deepcopy(REAL)
    scale = images / REAL["images"]
    for st in s["per_stage"]:
        for key in TOTALS:
            if st.get(key) is not None:
                st[key] *= scale
    s = _run(images=images, chunk=chunk, per_stage=s["per_stage"])
    m = images // chunk
    s["speedup"] = round(0.97 * 2 * m / (m + 1), 4)
    return s


def _advice(s: dict[str, Any], dominant: str) -> str:
    w = waterfall(s)
    assert w is not None and w["dominant"] == dominant, (w and w["dominant"], w and w["terms"])
    return w["advice"]


def test_imbalance_advice_never_names_the_policy_the_run_used() -> None:
    balanced = _advice(_imbalanced("balanced"), "imbalance")
    assert "--policy balanced" not in balanced and "rank 1 computes 93 ms per image against the mean stage's 61" \
        in balanced and "explicit --split" in balanced and "--refine" in balanced
    refined = _advice(_imbalanced("balanced", refine={"rounds": [{"round": 1, "split_points": ["blocks.6"]}]}),
                      "imbalance")
    assert "--refine" not in refined  # it did refine: the advice does not ask for what the run did
    assert "--policy balanced" in _advice(_imbalanced("equal"), "imbalance")
    explicit = _advice(_imbalanced("explicit"), "imbalance")
    assert "move a cut off it (--split)" in explicit


@pytest.mark.parametrize(("images", "chunk", "smaller"), [(6, 1, None), (24, 4, "a smaller --chunk than 4")])
def test_fill_drain_advice_asks_for_a_smaller_chunk_only_above_1(images: int, chunk: int, smaller: str | None) -> None:
    said = _advice(_few_microbatches(images, chunk), "fill_drain")
    assert said.startswith(f"more images per pass: {images // chunk} microbatches through 2 stages keep "), said
    assert f"{19 * chunk} images or more keep 95%" in said  # the fill_drain_bound flag's own figure
    assert ("--chunk" in said) == (smaller is not None) and (smaller is None or smaller in said), said


def test_interference_advice_names_the_host_and_what_shows_its_load() -> None:
    s = _run()
    for st in s["per_stage"]:  # the bottleneck (rank 1) waited for a CPU half its compute
        st["run_delay_s"] = st["compute_s"] / 2 if st["rank"] == 1 else 0.0
    said = _advice(s, "interference")
    assert said.startswith("free local1's cores of other work (rank 1 waited ") and "ms per image for a CPU" in said
    assert "`pictl check` shows each host's busy cores and run queue" in said


def test_communication_advice_leaves_out_a_wire_the_run_already_compresses() -> None:
    def slow_wire(fmt: str) -> dict[str, Any]:
        s = _run(chunk=2, wire={**REAL["wire"], "format": fmt})
        st = s["per_stage"][1]
        st["recv_wait_s"] = st["compute_s"]  # the bottleneck waited on the wire as long as it computed
        st["pass_s"] = st["wait_s"] + st["send_s"] + 2 * st["compute_s"]
        return s

    fp32 = _advice(slow_wire("fp32"), "communication")
    assert fp32 == "a compressing --wire (fp16, int8), a larger --chunk than 2, or a faster link"
    assert _advice(slow_wire("int8"), "communication") == "a larger --chunk than 2, or a faster link"
