"""Hostile and broken run records through the real CLI (`python -m pictl`): `runs`, `runs show`, `runs compare`
and `report` read every record through `RunSummary`; a record that does not keep it is left out of a list
with one `pictl: note:` line (its valid siblings still listed), and refused alone with one `pictl: error:`
line naming the file and the field (exit 2). Nothing a record holds reaches the terminal as an escape
sequence or Rich markup, and nothing it names becomes a path outside `--out`."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import ROOT, run_pictl
from support.disks import fill, small_tmpfs
from support.forked import PictlServer

BASE: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
GOOD = "20261124-100000-s2-good"
BAD = "20261124-110000-s2-bad"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What must never reach the terminal (tab and newline are layout)."""


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("FORCE_COLOR", None)
    return env


@pytest.fixture(scope="module")
def forks(tmp_path_factory) -> Iterator[PictlServer]:
    """Each command a process of its own, forked from one that imported pictl once (a fresh `python -m pictl`
    spends most of the second each of these commands takes importing)."""
    server = PictlServer(tmp_path_factory.mktemp("forks"), _env(), preload=("matplotlib.pyplot",))  # (`report`)
    yield server
    server.close()


def _pictl(forks: PictlServer, args: list[str], runs: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return forks.run(args, {**_env(), "PICTL_RUNS_DIR": str(runs)}, 120, cwd=cwd, errors="surrogateescape")


def _record(runs: Path, name: str, summary: dict[str, Any] | None = None, raw: str | bytes | None = None) -> Path:
    run = runs / name
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    body = raw if raw is not None else json.dumps({**(summary or BASE), "run_id": name, "run_dir": str(run)})
    (run / "summary.json").write_bytes(body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass"))
    return run


def _mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    summary = copy.deepcopy(BASE)
    change(summary)
    return summary


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("pictl: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    return errors[0]


def _clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert not CONTROL.search(proc.stdout), repr(proc.stdout[:2000])
    assert not CONTROL.search(proc.stderr), repr(proc.stderr[:2000])


# (what, how the bad record is made, what the one line must say besides the file)
CORRUPT: list[tuple[str, Callable[[Path], Path], str]] = [
    ('speedup "fast"', lambda r: _record(r, BAD, _mutated(lambda s: s.update(speedup="fast"))), "'speedup' is wrong"),
    ("flags a string", lambda r: _record(r, BAD, _mutated(lambda s: s.update(flags="host_hot"))), "'flags' is wrong"),
    ("split of ints", lambda r: _record(r, BAD, _mutated(lambda s: s.update(split_points=[4, 8]))),
     "'split_points.0' is wrong"),
    ('stages "two"', lambda r: _record(r, BAD, _mutated(lambda s: s.update(stages="two"))), "'stages' is wrong"),
    ("stages 0", lambda r: _record(r, BAD, _mutated(lambda s: s.update(stages=0))), "'stages' is wrong"),
    ('status "weird"', lambda r: _record(r, BAD, _mutated(lambda s: s.update(status="weird"))), "'status' is wrong"),
    ("a huge timestamp", lambda r: _record(r, BAD, _mutated(lambda s: s.update(started_at=1e300))),
     "'started_at' is wrong"),
    ("an infinite timestamp", lambda r: _record(r, BAD, raw=json.dumps({**BASE, "started_at": float("inf")})),
     "'started_at' is wrong"),
    ("a negative timestamp", lambda r: _record(r, BAD, _mutated(lambda s: s.update(started_at=-5.0))),
     "'started_at' is wrong"),
    ("a string timestamp", lambda r: _record(r, BAD, _mutated(lambda s: s.update(started_at="yesterday"))),
     "'started_at' is wrong"),
    ("a timestamp of 30 digits", lambda r: _record(r, BAD, _mutated(lambda s: s.update(started_at=10**30))),
     "'started_at' is wrong: a number too large"),
    ("a number of 5000 digits", lambda r: _record(r, BAD, raw=json.dumps(BASE)[:-1] + ', "x": 1' + "0" * 5000 + "}"),
     "not a JSON record"),
    ("a per-stage entry without its rank", lambda r: _record(r, BAD, _mutated(lambda s: s["per_stage"][0].pop("rank"))),
     "'per_stage.0.rank' is missing"),
    ("a negative rank", lambda r: _record(r, BAD, _mutated(lambda s: s["per_stage"][1].update(rank=-1))),
     "'per_stage.1.rank' is wrong"),
    ("a baseline without its host", lambda r: _record(r, BAD, _mutated(lambda s: s["baseline"].pop("host"))),
     "'baseline.host' is missing"),
    ("traces a string", lambda r: _record(r, BAD, _mutated(lambda s: s.update(traces="none"))), "'traces' is wrong"),
    ("a trace share that is text", lambda r: _record(r, BAD, _mutated(lambda s: s.update(
        traces=[{"directory": "t", "per_rank": {"0": {"compute_pct": "lots"}}}]))),
     "'traces.0.per_rank.0.compute_pct' is wrong"),
    ("a trace rank that is a list", lambda r: _record(r, BAD, _mutated(lambda s: s.update(
        traces=[{"directory": "t", "per_rank": {"0": [1, 2]}}]))), "'traces.0.per_rank.0' is wrong"),
    ("JSON nested 5000 deep", lambda r: _record(r, BAD, raw=_deep(5000)), "nested more than 64 levels deep"),
    ("a field nested 5000 deep", lambda r: _record(r, BAD, raw=json.dumps(BASE)[:-1] + ', "x": ' + _deep(5000) + "}"),
     "nested more than 64 levels deep"),
    ("a field nested 200 deep", lambda r: _record(r, BAD, raw=json.dumps(BASE)[:-1] + ', "x": ' + _deep(200) + "}"),
     "nested more than 64 levels deep (at 'x."),
    ("a summary cut short", lambda r: _record(r, BAD, raw=json.dumps(BASE)[:300]), "not a complete JSON record"),
    ("a summary not UTF-8", lambda r: _record(r, BAD, raw=b'{"run_id": "\xff"}'), "not a JSON record"),
    ("a JSON list", lambda r: _record(r, BAD, raw="[1, 2]"), "not a JSON object"),
    ("a newer schema", lambda r: _record(r, BAD, _mutated(lambda s: s.update(schema=99))), "written by a newer pictl"),
    ("a directory named summary.json", lambda r: _directory_summary(r), "not a regular file"),
    ("a FIFO named summary.json", lambda r: _fifo_summary(r), "not a regular file"),
]


def _directory_summary(runs: Path) -> Path:
    run = runs / BAD
    (run / "summary.json").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    return run


def _fifo_summary(runs: Path) -> Path:
    run = runs / BAD
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    os.mkfifo(run / "summary.json")  # a reader that opened it would block forever
    return run


REFUSING = (["runs", "show", BAD], ["runs", "show", "{bad}", "--json"], ["runs", "compare", GOOD, BAD],
            ["report", BAD, "--out", "{report}"])
"""Every reader of one run; each reads it through the one loader (`pictl.summary`), so each bad record is refused
by one of them in turn (every reader meets several kinds), and all of them by the first record."""


def _refused(forks: PictlServer, args: list[str], runs: Path, tmp_path: Path, bad: Path, fragment: str) -> None:
    args = [a.format(bad=bad, report=tmp_path / "report") for a in args]
    proc = _pictl(forks, args, runs, tmp_path)
    assert proc.returncode == 2, (args, proc.stderr[-2000:])
    line = _one_error(proc)
    assert line.startswith(f"pictl: error: {bad}/summary.json: ") and fragment in line, (args, line)
    assert proc.stdout == "", (args, proc.stdout[:500])
    _clean(proc)


@pytest.mark.parametrize("what, make, fragment", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_a_bad_record_is_skipped_in_lists_and_refused_alone(what: str, make: Callable[[Path], Path], fragment: str,
                                                            tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    _record(runs, GOOD)
    bad = make(runs)

    listed = _pictl(forks, ["runs", "--json"], runs, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [GOOD]  # the valid sibling, and only it
    notes = [line for line in listed.stderr.splitlines() if line.startswith("pictl: note: ")]
    assert len(notes) == 1 and notes == listed.stderr.strip().splitlines(), listed.stderr
    assert notes[0].startswith(f"pictl: note: skipped {bad}: summary.json: ") and fragment in notes[0], notes[0]
    case = [c[0] for c in CORRUPT].index(what)
    _refused(forks, REFUSING[case % len(REFUSING)], runs, tmp_path, bad, fragment)
    assert not (tmp_path / "report" / "report.md").exists()


def test_every_reader_refuses_a_bad_record_and_the_table_shows_its_good_sibling(tmp_path: Path, forks) -> None:
    what, make, fragment = CORRUPT[0]
    runs = tmp_path / "runs"
    good = _record(runs, GOOD)
    bad = make(runs)
    table = _pictl(forks, ["runs"], runs, tmp_path)
    assert table.returncode == 0 and GOOD in table.stdout and BAD not in table.stdout, table.stderr
    notes = [line for line in table.stderr.splitlines() if line.startswith("pictl: note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"pictl: note: skipped {bad}: summary.json: "), table.stderr
    _clean(table)
    for args in REFUSING:
        _refused(forks, args, runs, tmp_path, bad, fragment)
    assert not (tmp_path / "report" / "report.md").exists()
    shown = _pictl(forks, ["runs", "show", GOOD, "--json"], runs, tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["run_dir"] == str(good), shown.stderr


def test_a_run_directory_copied_elsewhere_is_read_where_it_is(tmp_path: Path, forks) -> None:
    """`run_dir` names the directory the run wrote; the copy is the one shown, compared and reported."""
    runs = tmp_path / "copied"
    first = _record(runs, GOOD, raw=json.dumps({**BASE, "run_id": GOOD, "run_dir": "/gone/elsewhere/" + GOOD}))
    second = _record(runs, BAD, raw=json.dumps({**BASE, "run_id": BAD, "run_dir": str(tmp_path / "runs" / BAD)}))
    listed = _pictl(forks, ["runs", "--json"], runs, tmp_path)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert {r["run_id"]: r["run_dir"] for r in json.loads(listed.stdout)} == {GOOD: str(first), BAD: str(second)}
    for ref in (GOOD, "20261124-10", str(first)):
        shown = _pictl(forks, ["runs", "show", ref, "--json"], runs, tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["run_dir"] == str(first)
    table = _pictl(forks, ["runs", "show", GOOD], runs, tmp_path)
    assert table.returncode == 0 and str(first) in table.stdout and "/gone/elsewhere" not in table.stdout
    compared = _pictl(forks, ["runs", "compare", GOOD, BAD, "--json"], runs, tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert [r["run_dir"] for r in json.loads(compared.stdout)] == [str(first), str(second)]
    report = _pictl(forks, ["report", GOOD, "--out", str(tmp_path / "out")], runs, tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "out" / f"{GOOD}-stages.png").read_bytes()[:4] == b"\x89PNG"


def test_a_bad_trace_grab_is_named_and_the_run_still_shown(tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    run = _record(runs, GOOD)
    (run / "traces").mkdir()
    (run / "traces" / "summary.json").write_text('{"directory": 5}')
    (run / "traces-2").mkdir()
    (run / "traces-2" / "summary.json").write_text(json.dumps({"directory": str(run / "traces-2"), "per_rank": {
        "0": {"compute_pct": 61.0, "send_pct": 9.0, "recv_wait_pct": 20.0, "idle_pct": 10.0}}}))
    shown = _pictl(forks, ["runs", "show", GOOD], runs, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.strip() == (f"pictl: note: skipped {run}/traces/summary.json: trace grab left out: "
                                    "'directory' is wrong: must be text (got 5)")
    assert "rank 0: compute 61%  send 9%  recv-wait 20%  idle 10%" in shown.stdout
    listed = _pictl(forks, ["runs", "--json"], runs, tmp_path)  # the list shows no traces: it reads none
    assert listed.returncode == 0 and listed.stderr == "" and len(json.loads(listed.stdout)) == 1


ESCAPES = {"run_id": "x\x1b]0;pwned title\x07", "model": "deit[pruned-0.3]", "policy": "[/]",
           "split_points": ["blocks.4\x1b[2J\x1b[H", "[bold red]blocks.8"],
           "error": {"type": "E", "message": "boom\x1b]52;c;cHduZWQ=\x07 and\nmore \x9b31m red"}}


def test_escapes_and_markup_in_a_record_are_shown_as_text(tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    bad = _record(runs, BAD, raw=json.dumps({**BASE, **ESCAPES, "flags": [{"code": "c\x1b[31m", "message": "[/]"}]}))
    _record(runs, GOOD)
    for args in (["runs"], ["runs", "show", BAD], ["runs", "compare", GOOD, BAD], ["runs", "export"]):
        proc = _pictl(forks, args, runs, tmp_path)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        _clean(proc)
        assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    shown = _pictl(forks, ["runs", "show", BAD], runs, tmp_path).stdout
    assert "deit[pruned-0.3]" in shown and "[/]" in shown and "[bold red]blocks.8" in shown
    assert "x\ufffd]0;pwned title\ufffd" in shown and "boom\ufffd]52;c;cHduZWQ=\ufffd and / more \ufffd31m red" in shown
    as_json = _pictl(forks, ["runs", "show", BAD, "--json"], runs, tmp_path)
    assert json.loads(as_json.stdout)["run_id"] == ESCAPES["run_id"]  # --json keeps the data, escaped by JSON
    assert "\x1b" not in as_json.stdout
    report = _pictl(forks, ["report", str(bad), "--out", str(tmp_path / "out")], runs, tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert not CONTROL.search(text.replace("\n", "")) and "## Run x\ufffd]0;pwned title\ufffd" in text
    assert [p.name for p in (tmp_path / "out").glob("*.png")] == ["x__0_pwned_title_-stages.png"]


ASCII_ONLY = {"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
"""A terminal that takes ASCII only: forced, and an old system's C locale (no UTF-8 mode, no coercion to C.UTF-8)."""


@pytest.mark.parametrize("locale", ASCII_ONLY, ids=["PYTHONIOENCODING=ascii", "LC_ALL=C"])
def test_an_ascii_only_terminal_gets_escapes_not_a_crash(locale: dict[str, str], tmp_path: Path) -> None:
    """`runs`, `runs show` and `hosts` ended in UnicodeEncodeError (exit 1) where the locale is not UTF-8: a table's
    box-drawing characters and a record's non-ASCII text are now drawn in ASCII and written escaped."""
    runs = tmp_path / "runs"
    _record(runs, GOOD, {**BASE, "model": "d\u00e9it_small", "policy": "\u00e9quilibr\u00e9"})
    _record(runs, BAD)
    inventory = tmp_path / "h\u00f4tes.toml"
    inventory.write_text(f'[cluster]\nname = "caf\u00e9"\n[defaults]\ntransport = "local"\n'
                         f'[[host]]\nname = "h0"\nworkdir = "{tmp_path}/\u00e9t\u00e9/h0"\n', encoding="utf-8")
    env = {**os.environ, "COLUMNS": "200", "PICTL_RUNS_DIR": str(runs), **locale}
    env.pop("FORCE_COLOR", None)
    for args, shown in ((["runs"], "\\xe9quilibr\\xe9"), (["runs", "show", GOOD], "d\\xe9it_small"),
                        (["runs", "compare", GOOD, BAD], "d\\xe9it_small"),
                        (["hosts", "--hosts", str(inventory)], "caf\\xe9")):
        proc = run_pictl(args, env, 120, cwd=tmp_path, errors="surrogateescape")
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert "Error" not in proc.stderr and "internal error" not in proc.stderr, (args, proc.stderr)
        assert proc.stdout.isascii(), (args, [c for c in proc.stdout if not c.isascii()][:5])
        assert shown in proc.stdout, (args, proc.stdout[:2000])
    table = run_pictl(["runs"], env, 120, cwd=tmp_path).stdout
    assert "+---" in table and "| run " in table, table  # Rich's ASCII box, not escaped box-drawing characters


def test_nan_and_infinity_in_a_record_give_strict_json(tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    _record(runs, BAD, raw=json.dumps({**BASE, "run_id": BAD, "speedup": float("nan"),
                                       "throughput_ips": float("inf"), "max_abs_diff": float("nan")}))

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))

    for args in (["runs", "--json"], ["runs", "show", BAD, "--json"], ["runs", "--json", "--sort", "speedup"]):
        proc = _pictl(forks, args, runs, tmp_path)
        assert proc.returncode == 0, proc.stderr
        strict(proc.stdout)
    assert strict(_pictl(forks, ["runs", "show", BAD, "--json"], runs, tmp_path).stdout)["speedup"] is None


@pytest.mark.parametrize("ref", ["", " ", "\t"])
def test_an_empty_run_name_is_refused(ref: str, tmp_path: Path, forks) -> None:
    """`runs show ''` once picked the only run (every id starts with '')."""
    runs = tmp_path / "runs"
    _record(runs, GOOD)
    for args in (["runs", "show", ref], ["runs", "compare", GOOD, ref], ["report", ref]):
        proc = _pictl(forks, args, runs, tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "names no run" in _one_error(proc)


def test_glob_characters_in_a_run_name_are_literal(tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    _record(runs, GOOD)
    for ref in ("*", "2026*", "[2]*", "?"):
        proc = _pictl(forks, ["runs", "show", ref], runs, tmp_path)
        assert proc.returncode == 2 and "no such run" in _one_error(proc), (ref, proc.stderr)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("run_id", ["../../x", "/tmp/abs", "..", ".hidden", "a/../../../b", "-rf", ""])
def test_report_names_charts_inside_out_whatever_the_run_id(run_id: str, tmp_path: Path, forks) -> None:
    """Chart names came from the record's run_id: `../../x` wrote two levels above --out."""
    runs = tmp_path / "runs"
    run = _record(runs, GOOD, raw=json.dumps({**BASE, "run_id": run_id}))
    out = tmp_path / "a" / "b" / "out"
    before = _files(tmp_path)
    proc = _pictl(forks, ["report", str(run), "--out", str(out)], runs, tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = _files(tmp_path) - before
    assert written and all(name.startswith("a/b/out") or name in ("a", "a/b") for name in written), written
    charts = [p.name for p in out.iterdir() if p.suffix == ".png"]
    assert len(charts) == 1 and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*-stages\.png", charts[0]), charts
    assert f"]({charts[0]})" in (out / "report.md").read_text()


def test_two_run_ids_that_clean_to_one_name_keep_their_own_charts(tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    a = _record(runs, GOOD, raw=json.dumps({**BASE, "run_id": "x/y"}))
    b = _record(runs, BAD, raw=json.dumps({**BASE, "run_id": "x?y"}))
    proc = _pictl(forks, ["report", str(a), str(b), "--out", str(tmp_path / "out")], runs, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["x_y-2-stages.png", "x_y-stages.png"]


@pytest.fixture
def full_disk(tmp_path: Path):  # noqa: ANN201
    """A 256 KiB tmpfs with room for a few KiB: enough for nothing a report writes whole."""
    with small_tmpfs(tmp_path / "small") as mount:
        (mount / "out").mkdir()
        fill(mount)
        yield mount


@pytest.mark.parametrize("room", [0, 8192], ids=["no room", "8 KiB of room"])
def test_report_on_a_full_disk_leaves_no_partial_file(room: int, full_disk: Path, tmp_path: Path, forks) -> None:
    runs = tmp_path / "runs"
    _record(runs, GOOD)
    filler = full_disk / "filler"
    with filler.open("r+b") as fh:
        fh.truncate(max(0, filler.stat().st_size - room))
    out = full_disk / "out"
    proc = _pictl(forks, ["report", GOOD, "--out", str(out)], runs, tmp_path)
    assert proc.returncode == 9, proc.stderr
    line = _one_error(proc)
    assert line.startswith(f"pictl: error: --out: cannot write {out}/") and "No space left on device" in line, line
    assert list(out.iterdir()) == [], [p.name for p in out.iterdir()]  # no 0-byte PNG, no temporary
