"""Every key pictl writes in a run summary is typed in `RunSummary`; readers get the typed record.

The real runs' summaries are checked the same way where they are made (tests/functional/test_run_local.py,
test_train.py, test_prune.py); here, a stored record of a real run, and the catalog's view of a run directory."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import ROOT
from support.typed import keys_written, untyped

from pictl.records.catalog import NO_SUMMARY, PendingRun, as_written, read_run
from pictl.records.catalog_rows import row
from pictl.summary_models import RunSummary

REAL = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())


def test_a_real_runs_summary_leaves_nothing_untyped() -> None:
    s = RunSummary.model_validate(REAL)
    assert untyped(s) == [] and keys_written(REAL) > 200
    assert untyped(RunSummary.model_validate({**REAL, "from_a_newer_pictl": 1})) == ["from_a_newer_pictl"]


def test_the_catalog_reads_a_run_as_its_typed_summary_and_keeps_it_as_written(tmp_path: Path) -> None:
    done, live = tmp_path / "20270101-000000-s2-aaaa", tmp_path / "20270101-000100-s2-bbbb"
    for run in (done, live):
        run.mkdir()
        (run / "config.json").write_text("{}")
    (done / "summary.json").write_text(json.dumps(REAL))
    found = read_run(done, traces=False)
    assert isinstance(found, RunSummary) and found.run_dir == str(done.absolute())
    assert as_written(found) == {**REAL, "run_dir": str(done.absolute())}  # no key a default adds
    pending = read_run(live)
    assert isinstance(pending, PendingRun) and row(pending)["status"] == NO_SUMMARY
    assert row(found)["speedup"] == REAL["speedup"]  # as the summary holds it: each view rounds it once
