"""Records read once into typed models where they come in: a rank's Chrome trace (`pictl.run.trace_files`), what a
pruning job reported of its artifact (`pictl.jobs.prune`), a training job's step times (its waterfall). Whatever
a host wrote is either read whole or refused with one line naming what is wrong, never a KeyError or a TypeError."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from pictl import errors as E
from pictl.job_summaries import PruneSummary
from pictl.jobs.prune import PrunedArtifact
from pictl.jobs.training.waterfall import train_waterfall
from pictl.run.trace_files import ChromeTrace, TraceEvent, load_trace, merge, rank_breakdown
from remote.floor.artifact_meta import ArtifactMeta

# -- traces -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "message"), [
    ([1, 2], "h0: not a chrome trace (no traceEvents list)"),
    ({"traceEvents": {"ph": "X"}}, "h0: not a chrome trace (no traceEvents list)"),
    ({"traceEvents": [], "baseTimeNanoseconds": 1.5}, "h0: baseTimeNanoseconds is not a whole number"),
    ({"traceEvents": [], "baseTimeNanoseconds": True}, "h0: baseTimeNanoseconds is not a whole number"),
])
def test_a_file_that_is_no_chrome_trace_is_refused_in_one_line(data: object, message: str) -> None:
    with pytest.raises(E.ConfigError) as refused:
        ChromeTrace.of(data, "h0")
    assert str(refused.value) == message


def test_an_event_whose_times_are_not_finite_numbers_is_left_out() -> None:
    ok, meta = {"ph": "X", "name": "ok", "ts": 2, "dur": 1.0, "tid": 3}, {"ph": "M", "name": "thread_name"}
    trace = ChromeTrace.of({"traceEvents": [
        ok, meta, 5, "x", None, {"ph": "X", "ts": "soon", "dur": 1}, {"ph": "X", "ts": 1.0, "dur": float("inf")},
        {"ph": "X", "ts": None, "dur": 1.0}, {"ph": "X", "ts": 1.0, "dur": float("nan")}, {"ts": True}]})
    assert [ev.raw for ev in trace.events] == [ok, meta]  # the rank's own dicts, as written
    first, second = trace.events
    assert (first.ph, first.name, first.ts, first.dur, first.tid, first.flow_id) == ("X", "ok", 2, 1.0, 3, None)
    assert (second.ts, second.dur, second.complete()) == (None, None, None)  # metadata has no time
    span = first.complete()
    assert span is not None and (span.start, span.end, span.tid) == (2, 3.0, 3)


def test_an_events_odd_fields_are_read_as_text_or_not_at_all() -> None:
    """A phase or thread that is no text or number (a hostile host) is read as none: no TypeError in the merge."""
    odd = TraceEvent.of({"ph": ["X"], "name": 7, "tid": {"a": 1}, "ts": 1.0, "dur": 1.0, "id": 4})
    assert odd is not None and (odd.ph, odd.name, odd.tid, odd.flow_id, odd.complete()) == (None, "7", None, None, None)
    flow = TraceEvent.of({"ph": "f", "id": 4.5, "ts": 1})
    assert flow is not None and flow.flow_id == "4.5"
    merged = merge({0: ("h0", {"traceEvents": [{"ph": ["X"], "ts": 1.0, "tid": [1]}]})}, {})
    assert merged["traceEvents"][-1] == {"ph": ["X"], "ts": 0.0, "tid": [1], "pid": 0}
    assert rank_breakdown({"traceEvents": [{"ph": ["X"], "ts": 1.0, "dur": 2.0}]})["microbatches"] == 0


def test_a_merged_event_keeps_the_ranks_keys_in_their_order() -> None:
    """Only pid, ts and a flow's id change; every other key is carried on where the rank wrote it."""
    events = [{"cat": "c", "ts": 5, "ph": "s", "id": 9, "args": {"x": [1]}, "tid": 2},
              {"ph": "X", "name": "process_labels", "ts": 6, "dur": 1, "pid": 77}]
    merged = merge({3: ("h", {"baseTimeNanoseconds": 2_000, "traceEvents": events})}, {"h": 1_000})
    placed = merged["traceEvents"][2:]
    assert [list(e) for e in placed] == [["cat", "ts", "ph", "id", "args", "tid", "pid"],
                                         ["ph", "name", "ts", "dur", "pid"]]
    assert placed[0] == {"cat": "c", "ts": 0.0, "ph": "s", "id": "3:9", "args": {"x": [1]}, "tid": 2, "pid": 3}
    assert placed[1]["ts"] == 1.0 and placed[1]["pid"] == 3  # an "X" named like a process label is an event
    assert events[0]["id"] == 9 and events[0]["ts"] == 5  # the rank's trace is left as it was


def test_a_trace_file_is_read_back_as_written_less_its_unusable_events(tmp_path: Path) -> None:
    path = tmp_path / "h0-rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 7, "traceEvents": [
        {"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "ts": "late"}], "deviceProperties": []}))
    assert load_trace(path) == {"schemaVersion": 1, "baseTimeNanoseconds": 7, "deviceProperties": [],
                                "traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}]}
    path.write_text(json.dumps({"traceEvents": [], "baseTimeNanoseconds": "7"}))
    with pytest.raises(E.ConfigError, match=r"h0-rank0.json: baseTimeNanoseconds is not a whole number$"):
        load_trace(path)


# -- a pruning job's artifact --------------------------------------------------------------------------

META = asdict(ArtifactMeta(
    base_model="deit_small_patch16_224", num_classes=10, heads={"blocks.0.attn": 5}, ratio=0.15, importance="hessian",
    params_base=21_000_000, params=16_000_000, macs_base=4_610_000_000, macs=3_370_000_000,
    accuracy={"before": 0.9, "pruned": 0.12, "epochs": [0.5, 0.886], "best": 0.886, "best_epoch": 2},
    widths={"embed_dim": 384, "blocks": [{"heads": 5, "head_dim": 64, "mlp": 1200}]}))


def test_a_pruned_artifacts_figures_are_the_summarys_columns() -> None:
    columns = PrunedArtifact.reported(META, "pi0").comparison()
    summary = PruneSummary(status="ok", job_id="p", artifact="m.safetensors", **columns).written()
    assert summary == {
        "status": "ok", "job_id": "p", "artifact": "m.safetensors", "base_model": "deit_small_patch16_224",
        "ratio": 0.15, "importance": "hessian", "params_base": 21_000_000, "params": 16_000_000,
        "macs_base": 4_610_000_000, "macs": 3_370_000_000, "top1_before": 0.9, "top1_pruned": 0.12,
        "top1_epochs": [0.5, 0.886], "top1": 0.886, "best_epoch": 2,
        "widths": {"embed_dim": 384, "blocks": [{"heads": 5, "head_dim": 64, "mlp": 1200}]}}
    bare = PrunedArtifact.reported({**META, "accuracy": {}, "widths": None}, "pi0").comparison()
    assert (bare["top1_before"], bare["top1_epochs"], bare["top1"], bare["widths"]) == (None, [], None, None)


@pytest.mark.parametrize(("meta", "message"), [
    ({k: v for k, v in META.items() if k != "macs"}, "'macs' is missing"),
    ({**META, "params": "many"}, "'params' is wrong: must be a whole number (got 'many')"),
    ({**META, "accuracy": None}, "'accuracy' is wrong: must be a table of named values (got None)"),
])
def test_an_artifact_reported_without_its_figures_fails_the_job_in_one_line(meta: dict, message: str) -> None:
    with pytest.raises(E.RunFailed) as failed:
        PrunedArtifact.reported(meta, "pi0")
    assert str(failed.value) == f"pi0: the pruning job's report of its artifact is not readable ({message})"


# -- a training job's step times -----------------------------------------------------------------------

def _rank(r: int, **given: object) -> dict:
    return {"rank": r, "steps": 10, "seconds": {"forward_s": 1.0, "backward_s": 2.0, "comm_s": 0.5}, **given}


def test_a_breakdown_row_without_its_figures_gives_no_waterfall() -> None:
    whole = {"mode": "ddp", "chunks": 1, "breakdown": [_rank(0), _rank(1, seconds={"forward_s": 0.5})]}
    found = train_waterfall(whole)
    assert found is not None and found["bottleneck_rank"] == 0 and found["dominant"] == "imbalance"
    assert train_waterfall({"mode": "ddp", "breakdown": whole["breakdown"]}) is not None  # chunks: one
    rows = [{"rank": 0, "steps": 10}, {"steps": 10, "seconds": {}}, {"rank": 0, "seconds": {"forward_s": 1.0}},
            {"rank": 0, "steps": 0, "seconds": {"forward_s": 1.0}}, "rank 0", {"rank": 0, "steps": 10, "seconds": []}]
    for row in rows:
        assert train_waterfall({"mode": "ddp", "chunks": 1, "breakdown": [_rank(1), row]}) is None, row
