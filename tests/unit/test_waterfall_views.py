"""Why not N, and latency, wherever a summary is read: `runs show`, `runs`, `runs compare`, `runs export`,
`report` (the waterfall chart, its terms and the latency table), a sweep's rows, tables and plots, and the
dashboard's bar. A summary from before the waterfall (no `waterfall`, no `latency`) reads as it did; one whose
waterfall is of another shape, or holds escapes and markup, is shown as text or not at all, never a crash.
No torchrun: the records are written by hand."""

from __future__ import annotations

import copy
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.cli import ROOT

from pictl.jobs.sweep import COLUMNS, SweepPoint, markdown_table, plot, row_of, write_table
from pictl.records import waterfall_view as wv
from pictl.run.waterfall import ALL_TERMS, TERMS, waterfall, waterfall_line
from pictl.summary import RecordInvalid, parse_summary
from pictl.summary_models import RunSummary

BASE: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
LATENCY = {"pipeline": {"p50_ms": 247.838, "p95_ms": 345.094, "p99_ms": 360.756, "mean_ms": 254.657,
                        "microbatches": 24},
           "serial": {"p50_ms": 206.021, "p95_ms": 346.593, "p99_ms": 365.454, "mean_ms": 211.402,
                      "microbatches": 24},
           "clock_aligned": True, "traced": None}
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NEW, OLD = "20261125-100000-s2-new", "20261125-090000-s2-old"


def _with_gap(**over: Any) -> dict[str, Any]:
    """The two-stage record as a run now writes it: its waterfall (computed from its own figures) and latency."""
    s = copy.deepcopy(BASE)
    s["latency"] = copy.deepcopy(LATENCY)
    s["waterfall"] = waterfall(s)
    s.update(over)
    return s


def _typed(summary: dict[str, Any]) -> RunSummary:
    return RunSummary.model_validate(summary)


def _record(runs: Path, name: str, summary: dict[str, Any]) -> Path:
    run = runs / name
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps({**summary, "run_id": name, "run_dir": str(run)}))
    return run


def _invoke(args: list[str], runs: Path, code: int = 0) -> Any:
    from typer.testing import CliRunner

    from pictl.cli import app

    result = CliRunner().invoke(app, [*args, "--runs-dir", str(runs)],
                                env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "200"})
    assert result.exit_code == code, (args, result.stdout, result.stderr, result.exception)
    assert not CONTROL.search(result.stdout) and not CONTROL.search(result.stderr)
    return result


def _runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    _record(runs, NEW, _with_gap())
    _record(runs, OLD, BASE)
    return runs


# -- the view ------------------------------------------------------------------------------------------------


def test_the_view_line_is_the_run_layers_line() -> None:
    """records/ may not import pictl.run: its copy of the line must say exactly what the run layer's says."""
    real = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
    gains = {"stages": 2, "speedup": 1.5088, "gap": 0.4912, "dominant": "interference", "advice": "free a core",
             "terms": [{"term": k, "points": p, "share": round(-p / 0.4912, 4)} for k, p in zip(
                 TERMS, (-0.1538, -0.0816, 1.0025, -1.8936, -0.0448, -0.0066, 0.6082, 0.0785), strict=True)]}
    flat = {"stages": 3, "speedup": 3.0, "gap": 0.0, "dominant": None, "advice": None,
            "terms": [{"term": k, "points": 0.0, "share": None} for k in TERMS]}
    for w in (waterfall(real), gains, flat):
        view = wv.waterfall_view(w)
        assert view is not None and wv.waterfall_line(view) == waterfall_line(w)
    assert wv.KNOWN_TERMS == ALL_TERMS


@pytest.mark.parametrize("odd", ["fast", [], 3, {"stages": 2}, {"stages": 2, "speedup": 1.1, "gap": 0.9, "terms": []},
                                 {"stages": 2, "speedup": float("nan"), "gap": 0.9, "terms": [{"term": "x",
                                                                                                "points": 1}]},
                                 {"stages": 2, "speedup": 1.0, "gap": 1.0, "terms": [{"term": 5, "points": 1}]},
                                 {"stages": 2, "speedup": 1.0, "gap": 1.0, "terms": [{"term": "x", "points": "lots"}]},
                                 {"stages": 2, "speedup": 1e300, "gap": 1.0, "terms": [{"term": "x", "points": 1}]},
                                 {"stages": 2, "speedup": 1.0, "gap": 1.0, "terms": ["x"]}])
def test_a_waterfall_of_another_shape_reads_as_none_or_the_record_is_refused(odd: Any) -> None:
    """A shape the summary's types refuse makes the record unreadable (named, never shown); one they take but
    the view cannot show (no terms, a figure out of bounds) reads as no waterfall and no latency."""
    raw = {**BASE, "waterfall": odd, "latency": odd}
    try:
        s = RunSummary.model_validate(raw)
    except ValidationError:
        with pytest.raises(RecordInvalid, match="waterfall|latency"):
            parse_summary(Path("summary.json"), raw)
        assert not isinstance(odd, dict) or odd.get("terms") not in (None, [])  # not the shapes below
        return
    assert wv.waterfall_of(s) is None and wv.latency_of(s) is None
    assert wv.unreadable(s, "waterfall") and wv.unreadable(s, "latency")
    assert not wv.unreadable(_typed(BASE), "waterfall")  # absent is not unreadable: an older summary
    figures = wv.compare_figures(s)
    assert set(figures) == set(wv.LATENCY_KEYS + wv.COMPARE_KEYS) and set(figures.values()) == {None}


def test_the_bar_fills_its_width_in_proportion_to_each_terms_points() -> None:
    w = wv.waterfall_of(_typed(_with_gap()))
    assert w is not None
    bar = wv.gap_bar(w, 20)
    assert len(bar.plain) == 20
    by_term = {t.term: abs(t.points) for t in w.terms}
    total = sum(by_term.values())
    # split_overhead holds 0.68 of the |points|: its segment (solid: a loss) is 14 of 20 cells
    assert bar.plain.count("█") >= round(20 * by_term["split_overhead"] / total)
    assert "░" in bar.plain  # the residual gained a little: shaded
    flat = wv.waterfall_view({"stages": 2, "speedup": 2.0, "gap": 0.0,
                              "terms": [{"term": "fill_drain", "points": 0.0}]})
    assert flat is not None and wv.gap_bar(flat).plain == ""


# -- runs show, list, compare, export --------------------------------------------------------------------------


def test_runs_show_explains_the_gap_and_shows_latency(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    out = _invoke(["runs", "show", NEW], runs).stdout
    text = " ".join(out.split())
    assert "why not 2" in out
    assert " ".join(waterfall_line(_with_gap()["waterfall"]).split()) in text  # the one line, whole
    for term in ("fill/drain", "imbalance", "split overhead", "residual"):
        assert re.search(rf"{term}\s+[+-]\d\.\d\d\s+-?\d+%", out), term
    assert "-0.68" in out and "83%" in out  # split_overhead: its points and share of the gap
    assert "to reduce split_overhead: cuts at block boundaries" in text
    assert "latency pipeline p50 247.8 p95 345.1 p99 360.8 ms; serial p50 206.0 p95 346.6 p99 365.5 ms" in text
    shown_json = json.loads(_invoke(["runs", "show", NEW, "--json"], runs).stdout)
    assert shown_json["waterfall"] == _with_gap()["waterfall"] and shown_json["latency"] == LATENCY  # as is

    old = _invoke(["runs", "show", OLD], runs).stdout
    assert "why not" not in old and "latency" not in old and "speedup" in old


def test_runs_list_and_export_carry_latency_and_the_dominant_term(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    listed = _invoke(["runs"], runs).stdout
    assert "p50 ms" in listed and "p95 ms" in listed and "dominant" in listed
    assert "247.8" in listed and "345.1" in listed and "split_overhead" in listed
    rows = {r["run_id"]: r for r in json.loads(_invoke(["runs", "--json"], runs).stdout)}
    assert rows[NEW]["latency_p50_ms"] == 247.838 and rows[NEW]["dominant"] == "split_overhead"
    assert rows[OLD]["latency_p50_ms"] is None and rows[OLD]["dominant"] is None
    exported = list(csv.DictReader(io.StringIO(_invoke(["runs", "export"], runs).stdout)))
    by_id = {r["run_id"]: r for r in exported}
    assert by_id[NEW]["latency_p95_ms"] == "345.094" and by_id[NEW]["dominant"] == "split_overhead"
    assert by_id[OLD]["latency_p50_ms"] == "" and by_id[OLD]["dominant"] == ""


def test_runs_compare_has_a_line_per_term_and_per_latency_percentile(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    other = _with_gap()
    other["waterfall"] = {**other["waterfall"], "dominant": "imbalance"}
    _record(runs, "20261125-110000-s2-other", other)
    out = _invoke(["runs", "compare", NEW, "20261125-110000-s2-other", OLD], runs).stdout
    cells = [[c.strip() for c in line.strip().strip("│").split("│")] for line in out.splitlines()
             if line.startswith("│")]
    lines = {row[0]: row[1:] for row in cells}
    labels = list(lines)
    assert labels.index("dominant") < labels.index("fill/drain points") < labels.index("residual points")
    for term in ("fill/drain", "imbalance", "split overhead", "interference", "communication", "runtime",
                 "baseline", "residual"):
        assert f"{term} points" in lines, term
    assert lines["split overhead points"] == ["-0.68", "-0.68", "-"]  # signed, as in every view
    assert lines["dominant"] == ["split_overhead", "imbalance", "-"]
    for percentile in ("p50", "p95", "p99"):
        assert f"latency {percentile} ms" in lines and f"serial latency {percentile} ms" in lines, percentile
    assert lines["latency p99 ms"] == ["360.8", "360.8", "-"] and lines["serial latency p50 ms"][2] == "-"
    assert labels.index("speedup") < labels.index("latency p50 ms") < labels.index("serial latency p99 ms")
    rows = json.loads(_invoke(["runs", "compare", NEW, OLD, "--json"], runs).stdout)
    assert rows[0]["fill_drain_points"] == -0.0408 and rows[1]["fill_drain_points"] is None


def test_escapes_and_markup_in_a_waterfall_are_shown_as_text(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    s = _with_gap()
    s["waterfall"]["terms"][0]["term"] = "[bold]fill\x1b]0;pwned\x07"
    s["waterfall"]["dominant"] = "[/]"
    s["waterfall"]["advice"] = "x\x1b[2J\nmore"
    _record(runs, NEW, s)
    out = _invoke(["runs", "show", NEW], runs).stdout
    assert "[bold]fill" in out and "(dominant: [/]; to reduce it: x" in out and "pwned" in out


# -- report ----------------------------------------------------------------------------------------------------


def test_report_draws_the_waterfall_and_tables_its_terms_and_latency(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    out = tmp_path / "report"
    _invoke(["report", NEW, OLD, "--out", str(out)], runs)
    chart = out / f"{NEW}-waterfall.png"
    assert chart.read_bytes()[:4] == b"\x89PNG"
    assert not (out / f"{OLD}-waterfall.png").exists()  # an older summary: no waterfall, no chart
    text = (out / "report.md").read_text()
    new, old = text.split(f"## Run {OLD}")
    assert f"![speedup waterfall]({chart.name})" in new and "### Why not 2x" in new
    assert "| **split overhead** | -0.68 | 83% |" in new and "| fill/drain | -0.04 | 5% |" in new
    assert "Dominant term: **split overhead**. What would reduce it: cuts at block boundaries" in new
    assert waterfall_line(_with_gap()["waterfall"]) in new
    assert "| pipeline | 247.8 | 345.1 | 360.8 | 254.7 | 24 |" in new and "| serial | 206.0 | 346.6 |" in new
    assert "Why not" not in old and "Latency per image" not in old and "| throughput img/s |" in old


def test_report_refuses_a_waterfall_it_cannot_read_naming_the_field(tmp_path: Path) -> None:
    """Every key of a summary is typed: a waterfall or latency of another shape is a record this pictl cannot
    read, refused in one line naming the file and the field (exit 2), with nothing written."""
    runs = tmp_path / "runs"
    _record(runs, NEW, _with_gap(waterfall={"stages": "two"}))
    out = tmp_path / "report"
    result = _invoke(["report", NEW, "--out", str(out)], runs, code=2)
    assert "summary.json: not a run summary ('waterfall" in result.stderr, result.stderr
    assert not list(out.glob("*"))


# -- sweeps ----------------------------------------------------------------------------------------------------


def test_sweep_rows_tables_and_plots_carry_latency(tmp_path: Path) -> None:
    pipeline = _with_gap()
    serial = {**copy.deepcopy(BASE), "stages": 1, "speedup": 1.0, "per_stage": BASE["per_stage"][:1],
              "latency": {"pipeline": LATENCY["serial"], "serial": LATENCY["serial"], "clock_aligned": True}}
    rows = [row_of(SweepPoint(1, 1, "serial"), _typed(serial)), row_of(SweepPoint(2, 1, "equal"), _typed(pipeline)),
            row_of(SweepPoint(2, 2, "balanced"), None, error="boom"), row_of(SweepPoint(2, 4, "equal"), _typed(BASE))]
    assert (rows[0]["latency_p50_ms"], rows[0]["dominant"]) == (206.021, None)
    assert (rows[1]["latency_p50_ms"], rows[1]["latency_p95_ms"], rows[1]["dominant"]) == (
        247.838, 345.094, "split_overhead")
    assert rows[3]["latency_p50_ms"] is None and rows[3]["dominant"] is None  # an older summary
    out = tmp_path / "sweep"
    out.mkdir()
    write_table(out, rows, {"started_at": 0})
    table = list(csv.DictReader((out / "table.csv").open()))
    assert tuple(table[0]) == COLUMNS and table[1]["latency_p95_ms"] == "345.094" and table[2]["dominant"] == ""
    md = (out / "table.md").read_text()
    assert md == markdown_table([{**r, "split_points": " ".join(r.get("split_points") or []),
                                  "flags": " ".join(r.get("flags") or [])} for r in rows])
    header = md.splitlines()[0]
    assert "latency_p50_ms" in header and "| 247.838 |" in md and len(header) < 150  # no wider than it was
    written = plot(out, rows)
    assert out / "throughput_vs_latency.png" in written
    assert (out / "throughput_vs_latency.png").read_bytes()[:4] == b"\x89PNG"

    # the report shows the sweep's runs' latency beside their throughput
    report = tmp_path / "report"
    from pictl.records.report import write_report

    text = write_report([out], report).read_text()
    assert "Throughput beside latency per image" in text
    assert "| 2 | 1 | equal | fp32 | 10.24 | 247.8 | 345.1 | split_overhead |" in text
    assert (report / "sweep-throughput_vs_latency.png").read_bytes()[:4] == b"\x89PNG"


# -- whatever a record holds there -----------------------------------------------------------------------------

_leaves = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(),
                    st.text(max_size=12), st.sampled_from(["[/]", "\x1b[2J", "fill_drain", "residual", "$x$"]))
_json = st.recursive(_leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=8)
_text = st.one_of(st.sampled_from([*TERMS, "[/]", "[bold]x", "\x1b]0;pwned\x07", "a\nb", "$\\frac{1}{0}$", "|"]),
                  st.text(max_size=12))
_figure = st.floats(min_value=-1e6, max_value=1e6)
_good = st.fixed_dictionaries({
    "stages": st.integers(min_value=1, max_value=8), "speedup": _figure, "gap": _figure,
    "terms": st.lists(st.fixed_dictionaries({"term": _text, "points": _figure,
                                             "share": st.one_of(st.none(), _figure)}), min_size=1, max_size=9),
    "dominant": st.one_of(st.none(), _text), "advice": st.one_of(st.none(), _text)})
_waterfalls = st.one_of(_json, _good, _good.map(lambda w: {**w, "terms": [*w["terms"], {"term": 3, "points": "x"}]}))
_latencies = st.one_of(_json, st.fixed_dictionaries({
    "pipeline": st.one_of(_json, st.fixed_dictionaries({"p50_ms": _leaves, "p95_ms": _leaves, "p99_ms": _leaves})),
    "serial": _json, "clock_aligned": _leaves}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(w=_waterfalls, latency=_latencies)
def test_any_waterfall_and_latency_are_shown_or_left_out_never_a_crash(w: Any, latency: Any, tmp_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from pictl.records.report_waterfall import gap_lines
    from pictl.records.train_report import ReportFiles

    raw = {**BASE, "waterfall": w, "latency": latency}
    try:
        s = RunSummary.model_validate(raw)
    except ValidationError:  # the summary's types refuse it: the record is named as unreadable, never shown
        with pytest.raises(RecordInvalid):
            parse_summary(Path("summary.json"), raw)
        return
    grid = Table.grid()
    grid.add_column()
    grid.add_column()
    wv.add_latency_rows(grid, s)
    wv.add_gap_rows(grid, s)
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(grid)
    view = wv.waterfall_of(s)
    if view is not None:
        console.print(wv.gap_bar(view), wv.line_text(view))
    assert not CONTROL.search(console.file.getvalue())  # type: ignore[attr-defined]
    wv.compare_figures(s)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    lines = gap_lines("run", s, ReportFiles(out))
    assert not any(CONTROL.search(line) for line in lines)


def test_a_replicated_run_is_taken_apart_against_every_rank() -> None:
    """R replicas of S stages: the ideal is R x S; one stage per replica has no fill and drain; every rank's
    figures are per image of its replica's share, so the same ranks as one 2-stage pipeline compute twice the
    images per pass as replicas; the terms still add up to the gap exactly."""
    s = copy.deepcopy(BASE)
    s.update(stages=1, replicas=2)
    w = waterfall(s)
    assert w is not None and w["stages"] == 2 and w["replicas"] == 2
    points = {t["term"]: t["points"] for t in w["terms"]}
    assert points["fill_drain"] == 0.0
    if w["dominant"] == "split_overhead":  # one stage per copy: no cut to move, the copies computed slower
        assert "copies" in w["advice"]
    assert sum(points.values()) == pytest.approx(s["speedup"] - 2, abs=1e-3)
    pipeline = waterfall(copy.deepcopy(BASE))
    assert pipeline is not None
    # The same counters over half the images per rank: each rank's compute per image is twice the pipeline's.
    assert w["per_image_ms"]["bottleneck_compute"] == pytest.approx(2 * pipeline["per_image_ms"]["bottleneck_compute"],
                                                                    rel=1e-3)


# -- one convention in every view -------------------------------------------------------------------------------


def test_every_view_writes_the_same_speedup_and_the_same_signed_terms(tmp_path: Path) -> None:
    """One summary through every view: the result line, `pictl runs`, `runs show`, `runs compare`, the report and
    the dashboard's history row (its cells, from the same row its state holds). The speedup 1.1749 reads 1.17x in
    each (rounded once: `pictl runs` rounded it to 1.175 first, and 1.175 reads 1.18x); every term is the same
    signed points (a loss negative), and the term that gave points back says why the losses pass 100 %."""
    from pictl.headless import explain_lines, summary_fields
    from pictl.records.catalog import read_run
    from pictl.records.catalog_rows import row
    from pictl.tui.widgets.history import COLUMNS as HISTORY
    from pictl.tui.widgets.history import history_cells

    s = copy.deepcopy(BASE)
    s["latency"] = copy.deepcopy(LATENCY)
    s["speedup"] = 1.1749
    s["waterfall"] = waterfall(s)
    s["energy"] = {"pipeline_j_per_image": 0.4501, "serial_j_per_image": 0.5763, "pipeline_power_w": 2.948,
                   "serial_power_w": 2.948, "source": "pmic", "machines": 1}
    runs = tmp_path / "runs"
    run = _record(runs, NEW, s)
    _record(runs, OLD, BASE)
    typed = _typed({**s, "run_id": NEW, "run_dir": str(run)})
    out = tmp_path / "report"
    _invoke(["report", NEW, "--out", str(out)], runs)
    history = dict(zip((key for _, key in HISTORY), (c.plain for c in history_cells(row(read_run(run, traces=False)))),
                       strict=True))
    views = {
        "result line": " ".join([*summary_fields(typed), *explain_lines(typed)]),
        "runs": _invoke(["runs"], runs).stdout,
        "runs show": _invoke(["runs", "show", NEW], runs).stdout,
        "runs compare": _invoke(["runs", "compare", NEW, OLD], runs).stdout,
        "report": (out / "report.md").read_text().split(f"## Run {OLD}")[0],
        "dashboard history": " ".join(history.values()),
    }
    assert history["speedup"] == "1.17x"
    for name in ("result line", "runs show", "report"):  # joules per image, written one way
        assert "0.450 J/img (serial 0.576)" in " ".join(views[name].split()), name
    assert re.search(r"J/img\s+│\s+0\.450\s", views["runs compare"]), views["runs compare"]
    for name, text in views.items():
        assert "1.17x" in text, name
        for wrong in ("1.175", "1.18x", "1.1749"):
            assert wrong not in text, (name, wrong)
    terms = [t for t in s["waterfall"]["terms"] if abs(t["points"]) >= 0.005]
    assert {t["term"] for t in terms if t["points"] < 0} == {"fill_drain", "imbalance", "split_overhead", "runtime"}
    assert [t["term"] for t in terms if t["points"] > 0] == ["residual"]
    for name in ("result line", "runs show", "runs compare", "report"):
        for t in terms:
            signed = f"{t['points']:+.2f}"  # -0.68, +0.02: never 0.68 for a loss
            assert re.search(rf"(?<![\d.+-]){re.escape(signed)}(?!\d)", views[name]), (name, t["term"], signed)
        assert not re.search(r"split overhead\s+0\.68", views[name]), name  # a loss is never written positive
    # The shares: they add up to the gap, and where a term gave points back the views say why.
    view = wv.waterfall_view(s["waterfall"])
    assert view is not None
    note = wv.share_note(view)
    assert note is not None, view
    assert re.search(r"the losses \(-0\.\d\d\) are 10\d% of it because residual gave \+0\.0\d back", note), note
    assert note in " ".join(views["runs show"].split()) and note[1:] in " ".join(views["report"].split())
