"""A SUSPECT result in every view that shows a run's status: the result line's first word, `pictl runs` (its status
column and `--status suspect`), `runs show`, the report, the dashboard's run panel and its toast. The record is a
real run's summary (`data/run_summary_two_stages.json`) whose serial baseline waited for a CPU, as the run itself
computes its flags and verdict; no torchrun."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from support.cli import ROOT

from pictl.headless import summary_fields
from pictl.run.flags import compute_flags
from pictl.summary_models import RunSummary, SanityFlag
from pictl.verdict import verdict_of

BASE: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
SUSPECT_RUN, OK_RUN = "20261126-100000-s2-susp", "20261126-090000-s2-fine"


def _judged(s: dict[str, Any]) -> dict[str, Any]:
    """The summary with the flags and verdict a run of this pictl writes for its figures."""
    s["flags"] = [f.to_json() for f in compute_flags(RunSummary.model_validate(s))]
    s["verdict"], s["suspect_because"] = verdict_of([SanityFlag.model_validate(f) for f in s["flags"]])
    return s


def _suspect() -> dict[str, Any]:
    s = copy.deepcopy(BASE)
    s["serial_timing"] = {"compute_per_image_s": 0.1, "run_delay_per_image_s": 0.06}  # the baseline waited 60 %
    return _judged(s)


def _runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    for name, s in ((SUSPECT_RUN, _suspect()), (OK_RUN, _judged(copy.deepcopy(BASE) | {"hosts": {}}))):
        run = runs / name
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        (run / "summary.json").write_text(json.dumps({**s, "run_id": name, "run_dir": str(run)}))
    return runs


def _invoke(args: list[str], runs: Path) -> str:
    from typer.testing import CliRunner

    from pictl.cli import app

    result = CliRunner().invoke(app, [*args, "--runs-dir", str(runs)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result.stdout


def test_a_suspect_result_reads_suspect_wherever_its_status_is_shown(tmp_path: Path) -> None:
    s = _suspect()
    because = s["suspect_because"]
    assert s["verdict"] == "suspect" and because.startswith("host_overloaded: local0: during the serial baseline")
    assert summary_fields(RunSummary.model_validate(s))[0] == "SUSPECT"
    runs = _runs(tmp_path)
    rows = {r["run_id"]: r for r in json.loads(_invoke(["runs", "--json"], runs))}
    assert rows[SUSPECT_RUN]["status"] == "suspect" and rows[OK_RUN]["status"] == "ok"
    assert [r["run_id"] for r in json.loads(_invoke(["runs", "--json", "--status", "suspect"], runs))] == [SUSPECT_RUN]
    listed = _invoke(["runs"], runs)
    assert any(SUSPECT_RUN in line and "suspect" in line for line in listed.splitlines()), listed
    shown = " ".join(_invoke(["runs", "show", SUSPECT_RUN], runs).split())
    assert "status suspect" in shown and f"suspect {' '.join(because.split())}" in shown
    _invoke(["report", SUSPECT_RUN, "--out", str(tmp_path / "report")], runs)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "status **suspect**" in report and f"**SUSPECT**: {because}" in report


async def test_the_dashboard_says_suspect_with_the_cause_beside_the_speedup(tmp_path: Path) -> None:
    import html
    import re

    from pictl.inventory import load_cluster
    from pictl.tui.app import PictlApp
    from pictl.tui.messages import RunFinished
    from pictl.tui.rows import Ending
    from pictl.tui.widgets.run_panel import result_line

    summary = RunSummary.model_validate({**_suspect(), "run_id": SUSPECT_RUN})
    assert result_line(summary).startswith("SUSPECT: speedup 1.17x")
    app = PictlApp(load_cluster(ROOT / "hosts.toml"), runs_root=tmp_path / "runs")
    async with app.run_test(size=(140, 44)) as pilot:
        app.post_message(RunFinished(summary, Ending.of()))
        await pilot.pause()
        svg = app.export_screenshot()
    text = " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())
    # On the speedup's own row, and its cause whole under the outputs (a 24-line terminal keeps both in view)
    assert re.search(r"speedup 1\.17x( of \dx ideal efficiency [\d.]+)? SUSPECT", text), text
    assert "SUSPECT host_overloaded: local0: during the" in text and "speedup reads high" in text, text
    assert text.index("outputs") < text.index("SUSPECT host_overloaded"), text
