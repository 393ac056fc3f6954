"""Figures declared once: each summary model's figures carry their label, unit, format, direction and help
(`pictl.figure_text.Figure`), and every view that shows a figure writes the string its declaration writes: the
result line, `runs show`, the report's headline table, the tables of rows (`pictl runs`, `runs compare`, the
dashboard's history) and the trackers (the figure's value, under its field's name). No torchrun: the record is
the two-stage one the view tests use, its figures set to values that round differently in each format."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support.cli import ROOT

from pictl.figure_text import Figure, declared, figure_of, figures
from pictl.headless import summary_fields
from pictl.jobs.generation.figures import Agreement, GenerateSummary, Pace
from pictl.records.catalog import read_run
from pictl.records.catalog_rows import COLUMNS, COMPARE_COLUMNS, TABLE_FIGURES, cell, compare_rows, row
from pictl.records.report import write_report
from pictl.records.run_details import LEFT_OUT, run_details
from pictl.records.trackers import run_series
from pictl.summary_figures import EnergyFigures, LatencyFigures
from pictl.summary_models import RunSummary
from pictl.tui.widgets.history import COLUMNS as HISTORY
from pictl.tui.widgets.history import history_cells

BASE: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
MODELS = (RunSummary, EnergyFigures, LatencyFigures, GenerateSummary, Pace, Agreement)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_declared_figure_has_a_unit_a_format_a_direction_and_help(model: type) -> None:
    found = list(declared(model))
    assert found, f"{model.__name__} declares no figures"
    for name, fig in found:
        assert isinstance(fig, Figure) and fig is figure_of(model, name)
        assert fig.label and fig.label == fig.label.strip(), name
        assert fig.unit in ("img/s", "tok/s", "x", "", "%", "J/img", "W", "ms"), (name, fig.unit)
        assert fig.better in ("higher", "lower", None), name
        assert fig.help.endswith(".") and "\n" not in fig.help and len(fig.help) <= 200, (name, fig.help)
        # A missing figure reads as missing, never as a number or a crash; a present one as its format.
        assert fig.text(None) in ("-", "n/a"), name
        assert fig.text(float("nan")) in ("-", "n/a"), name
        assert fig.text(1.23456) not in ("-", "n/a"), name
        assert model.model_fields[name].is_required() is False, name  # an older record lacks it


def test_the_declared_figures_are_the_ones_the_views_and_trackers_know() -> None:
    assert [n for n, _ in declared(RunSummary)] == ["throughput_ips", "serial_ips", "speedup", "efficiency",
                                                    "agreement", "accuracy"]
    assert figure_of(RunSummary, "speedup").shown(2.0049) == "2.00x"
    assert figure_of(RunSummary, "throughput_ips").field(None) == "pipeline - img/s"
    assert figure_of(EnergyFigures, "pipeline_j_per_image").shown(0.45) == "0.450 J/img"
    assert figure_of(RunSummary, "accuracy").shown(0.8125) == "81.25%"
    # Every run figure is a column of the rows (`pictl runs`, compare, the CSV, the history), under its name.
    assert {name for name, _ in declared(RunSummary)} <= set(COLUMNS)
    with pytest.raises(KeyError):
        figure_of(RunSummary, "run_id")
    assert list(figures(None)) == []


def _summary(run: Path) -> dict[str, Any]:
    s = copy.deepcopy(BASE)
    # Values each format rounds its own way (1.1749 -> 1.17x, never 1.175 or 1.18x).
    s |= {"throughput_ips": 7.70449, "serial_ips": 6.55751, "speedup": 1.1749, "efficiency": 0.58745,
          "accuracy": 0.8125, "agreement": 0.9583, "run_id": run.name, "run_dir": str(run),
          "energy": {"pipeline_j_per_image": 0.4501, "serial_j_per_image": 0.5763, "pipeline_power_w": 2.948,
                     "serial_power_w": 2.948, "source": "pmic", "machines": 1}}
    return s


def _text(renderable: Any) -> str:
    console = Console(record=True, width=240, color_system=None, file=io.StringIO())
    console.print(renderable)
    return " ".join(console.export_text().split())


def test_every_view_writes_a_figure_as_its_declaration_does(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20261127-060000-s2"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps(_summary(run)))
    found = read_run(run, traces=False)
    assert isinstance(found, RunSummary)
    report = write_report([run], tmp_path / "report").read_text()
    history = dict(zip((key for _, key in HISTORY), (c.plain for c in history_cells(row(found))), strict=True))
    compare = compare_rows([run])[0]
    line = " ".join(summary_fields(found))
    shown = _text(run_details(found))
    tracked = run_series(run, found).final
    for name, fig, value in figures(found):
        assert value is not None, name
        text = fig.text(value)
        if name in ("throughput_ips", "serial_ips", "speedup", "accuracy"):
            assert fig.field(value) in line, (name, line)
        if name not in LEFT_OUT:
            assert f"{fig.label} {fig.shown(value)}" in shown, (name, shown)
        if name in TABLE_FIGURES:
            assert cell(name, compare[name]) == text and name in COMPARE_COLUMNS, name
            assert f"| {text} |" in report, (name, text)
        if name in dict(HISTORY).values():
            assert history[name] == text, (name, history)
        assert tracked[name] == pytest.approx(value), name
    for name, fig, value in figures(found.energy):
        assert tracked[f"energy/{name}"] == pytest.approx(value), name
        if name.endswith("_j_per_image"):  # the result line and runs show write joules per image one way
            assert fig.text(value) in line and fig.text(value) in shown, name
    assert "1.17x" in line and "1.17x" in shown and history["speedup"] == "1.17x"
    # The report's headline table: the declared figures' headings and cells, in their order.
    assert "| throughput img/s | serial img/s | speedup | efficiency | outputs match |\n|---|---|---|---|---|\n" \
           "| 7.70 | 6.56 | 1.17x | 0.59 | True |" in report


def test_a_summary_part_read_through_its_model_is_written_as_the_run_measured_it() -> None:
    """summarize reads the per-stage records it built through `StageFigures` (by field, not by string key): the
    links' figures keep the counters' own values and types (an int 0 stays 0 in summary.json, never 0.0)."""
    from pictl.planning.options import RunOptions
    from pictl.run.summarize import wire_summary
    from pictl.summary_models import StageFigures

    assert StageFigures.view({"rank": 0, "compress_s": 0}).compress_s == 0
    assert isinstance(StageFigures.view({"rank": 0, "compress_s": 0}).compress_s, int)
    assert StageFigures.view({"rank": 1}).modules == [] and StageFigures.view(None).bytes_sent is None
    per_stage = [{"rank": 0, "modules": ["blocks.0"], "bytes_sent": 4000, "raw_bytes": 8000, "compute_s": 2,
                  "compress_s": 0, "peak_Bps": 1000},
                 {"rank": 1, "modules": ["blocks.6"], "decompress_s": 0.5}]
    wire = wire_summary(RunOptions(stages=2, wire="fp16"), per_stage)
    assert wire["links"] == [{"link": "0->1", "cut": "blocks.6", "format": "fp16", "wire_bytes": 4000,
                              "raw_bytes": 8000, "ratio": 0.5, "compress_s": 0, "decompress_s": 0.5,
                              "avg_Bps": 2000.0, "peak_Bps": 1000}]
    assert json.dumps(wire["links"][0]).count(".0") == 1  # avg_Bps alone, as computed; the counters as sent
