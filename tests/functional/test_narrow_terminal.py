"""What a person at an 80-column terminal reads (stdout a real pseudo-terminal 80 wide, COLUMNS=80, through the
real CLI): `pictl check` and `pictl runs` leave their least important columns out, and say so, rather than
squeeze every cell to `h…`; a run's result line breaks between its fields, never inside one; its stage table
fits; its traces say where they are and how to open them; the serial run says what it is doing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import ROOT, finished, run_pictl_on_terminal
from support.clusters import write_cluster

from pictl.headless import summary_fields
from pictl.summary_models import RunSummary

SUMMARY = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())


def _rows(text: str, bar: str = "│") -> list[list[str]]:
    return [[c.strip() for c in line.split(bar)[1:-1]] for line in text.splitlines() if line.startswith(bar)]


def _words(text: str) -> str:
    return " ".join(text.split())


def test_check_leaves_out_its_least_important_columns_at_80(tmp_path: Path, pictl_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 3)
    narrow = run_pictl_on_terminal(["check", "--hosts", str(hosts)], pictl_env, 60)
    assert narrow.returncode == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 80 and "…" not in narrow.stdout, narrow.stdout
    headings = _rows(narrow.stdout, "┃")[0]
    assert headings[:6] == ["host", "ready", "ssh", "python", "venv", "torch"] and "warm" not in headings
    assert "busy cores" in headings  # other work on a host stays in view (timm's version goes first)
    assert [(r[0], r[1], r[2]) for r in _rows(narrow.stdout)] == [(f"h{i}", "yes", "ok") for i in range(3)]
    assert "left out at 80 columns: power W, warm, rendezvous, interface" in _words(narrow.stdout)
    assert "pictl check --json has every field" in _words(narrow.stdout)
    wide = run_pictl_on_terminal(["check", "--hosts", str(hosts)], pictl_env, 60, columns=200)
    assert len(_rows(wide.stdout, "┃")[0]) == 19 and "left out" not in wide.stdout, wide.stdout


def test_runs_keeps_the_run_its_status_speedup_and_match_at_80(tmp_path: Path, pictl_env) -> None:
    runs = tmp_path / "runs"
    for name, speedup in (("20261124-100000-s2-aaaa", 1.62), ("20261124-110000-s2-bbbb", 1.71)):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.json").write_text("{}")
        (runs / name / "summary.json").write_text(json.dumps({**SUMMARY, "run_id": name, "run_dir": str(runs / name),
                                                              "speedup": speedup}))
    proc = run_pictl_on_terminal(["runs", "--runs-dir", str(runs)], pictl_env, 60)
    assert proc.returncode == 0, proc.stderr
    assert max(map(len, proc.stdout.splitlines())) <= 80 and "…" not in proc.stdout, proc.stdout
    headings = _rows(proc.stdout, "┃")[0]
    assert {"run", "status", "img/s", "speedup", "match"} <= set(headings) and "p95 ms" not in headings
    rows = [dict(zip(headings, r, strict=True)) for r in _rows(proc.stdout)]
    assert [(r["run"], r["speedup"]) for r in rows] == [("20261124-110000-s2-bbbb", "1.71x"),
                                                        ("20261124-100000-s2-aaaa", "1.62x")]
    assert "left out at 80 columns: p95 ms" in _words(proc.stdout) and "--json has every column" in _words(proc.stdout)


@pytest.mark.slow
def test_a_run_read_at_80_columns(tmp_path: Path, pictl_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = run_pictl_on_terminal(["run", "--hosts", str(hosts), "--stages", "2", "--policy", "equal", "--images", "4",
                                  "--warmup", "1", "--repeats", "1", "--trace-steps", "2", "--headless"], pictl_env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    run_dir = Path(next(line for line in lines if line.startswith("run directory: ")).removeprefix("run directory: "))
    summary = RunSummary.model_validate_json((run_dir / "summary.json").read_text())
    # The result line's fields, each whole on one line; the lines within 80 columns (the paths soft-wrapped: one
    # the terminal folds is still one line to copy).
    fields = summary_fields(summary)
    assert len(fields) == 9 and fields[-1].startswith("energy ") and lines[0].startswith(f"{fields[0]}  {fields[1]}")
    for field in fields:
        assert any(field in line for line in lines), (field, proc.stdout)
    assert max(len(line) for line in lines if not line.startswith(("run directory: ", "traces: "))) <= 80
    # The stage table, its essential columns whole.
    assert "…" not in proc.stdout, proc.stdout
    table = _rows(proc.stdout)
    assert [r[:2] for r in table if r[0] in ("0", "1")] == [["0", "h0"], ["1", "h1"]]
    # Where the traces are and how to open them.
    timeline = summary.traces[0].timeline
    assert timeline and Path(timeline).is_file()
    assert f'traces: open {timeline} at https://ui.perfetto.dev ("Open trace file")' in proc.stdout
    # The serial run is never silent: the model built, the warm-up pass, the timed pass.
    err = proc.stderr
    assert "pictl serial: the whole model (" in err and "pictl serial: warm-up pass 1: " in err, err
    assert err.index("pictl serial: warm-up pass 1") < err.index("pictl serial: pass 1: ")


def test_the_live_stage_table_fits_80_columns() -> None:
    """While the pipeline runs, a terminal's live table: every heading whole at 80 columns (one column left out)."""
    import io

    from rich.console import Console

    from pictl.events import Phase, RankEvent
    from pictl.headless import HeadlessRenderer
    from remote.floor.run_records import Progress

    out = io.StringIO()
    renderer = HeadlessRenderer(console=Console(file=out, width=80, force_terminal=True, soft_wrap=True))
    renderer(Phase("pipeline", "launching 2 stage(s) on 2 host(s)"))
    for rank in (0, 1):
        renderer(RankEvent(f"h{rank}", f"h{rank}", Progress(
            t=0.0, role="pipeline", rank=rank, stage=rank, phase="calibrate", repeat=0, microbatches=4,
            microbatches_total=8, compute_s=0.3, wait_s=0.0, send_s=0.01, bytes_sent=1_200_000)))
    renderer._live.refresh()  # type: ignore[union-attr]  (a frame now, not at the next tick)
    renderer.close()
    drawn = out.getvalue()
    assert "microbatches" in drawn and "calibrate 0" in drawn and "…" not in drawn, drawn
    assert "left out at 80 columns: MB sent" in drawn
