"""The dashboard's class board (g) under the real Textual Pilot: the folder asked for in a one-field form, the rows
`pictl board` prints for the same folder (its Markdown export, read cell by cell) in its order, the highlighted
row's why below the table, and a folder without bundles one line in the form. No torch, no run: the bundles are
written here (well-formed but not signed by any key, and one not a bundle at all), so every row fails a check."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run_pictl
from support.clusters import write_cluster
from textual.widgets import DataTable, Input, Static

from pictl.inventory import load_cluster
from pictl.jobs.grading.bundle import sha256, write_bundle
from pictl.tui.app import PictlApp
from pictl.tui.widgets.board_screen import BoardForm, BoardScreen

TEAMS = {"Team A": [30.0, 31.0, 29.0], "Team B": [50.0, 52.0, 49.0], "Team C": [10.0, 11.0, 12.0]}
"""Each team's img/s per pass over a serial 10 img/s: speedups 3.0 (below), 5.0 (full) and 1.1 (below)."""


def _bundles(folder: Path) -> None:
    folder.mkdir()
    for team, passes in TEAMS.items():
        summary = {"status": "ok", "run_id": team, "stages": 4, "policy": "balanced", "chunk": 8,
                   "serial_ips": 10.0, "pass_ips": passes, "accuracy": 0.9 if team != "Team C" else 0.5}
        members = {"summary.json": json.dumps(summary).encode(),
                   "config.json": json.dumps({"options": {"wire": "fp32", "numerics": "fp32"}}).encode()}
        manifest = json.dumps({"format": "pictl-bundle", "version": 1, "team": team,
                               "members": {n: sha256(b) for n, b in members.items()}}).encode()
        (folder / f"{team[-1].lower()}.bundle.tgz").write_bytes(write_bundle(manifest, b"not a signature", members))
    (folder / "z.bundle.tgz").write_bytes(b"not a gzip'd tar")  # unreadable: no speedup, last


def _markdown_rows(folder: Path, tmp_path: Path) -> list[list[str]]:
    target = tmp_path / "board.md"
    proc = run_pictl(["board", str(folder), "--markdown", str(target)], None, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in target.read_text().splitlines() if line.startswith("| ")][1:]  # (the headings)
    return [[cell.strip().replace("\\|", "|") for cell in line.strip("| ").split(" | ")] for line in lines]


def _app(tmp_path: Path) -> PictlApp:
    return PictlApp(load_cluster(write_cluster(tmp_path / "cluster", 2)), runs_root=tmp_path / "runs", monitor=False)


async def test_the_board_shows_pictl_boards_rows_fastest_first_with_the_highlighted_rows_why(tmp_path: Path) -> None:
    folder = tmp_path / "lab3"
    _bundles(folder)
    printed = _markdown_rows(folder, tmp_path)
    assert [r[0] for r in printed] == ["Team B", "Team A", "Team C", "?"]  # fastest first; unreadable last
    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("g")
        await pilot.pause()
        assert isinstance(app.screen, BoardForm)
        await pilot.press(*str(folder), "ctrl+s")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, BoardScreen)
        table = screen.query_one(DataTable)
        shown = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        # Every cell as `pictl board` writes it; the verified cell holds the verdict, its why goes below.
        assert [r[:-1] for r in shown] == [r[:-1] for r in printed]
        assert [r[-1] for r in shown] == ["no"] * 4
        whys = [r[-1].removeprefix("no: ") for r in printed]
        assert "full" in shown[0] and "90.0%" in shown[0] and "50.0% <" in shown[2]  # marks as printed
        assert f"4 bundles in {folder}" in str(screen.query_one("#board-title", Static).render())
        detail = screen.query_one("#board-detail", Static)
        assert whys[0] in str(detail.render())  # the first row is highlighted on opening
        await pilot.press("down", "down", "down")
        await pilot.pause()
        said = str(detail.render())
        assert whys[3].startswith("unreadable: ") and whys[3] in said and whys[0] not in said
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, (BoardScreen, BoardForm))
        await pilot.press("g")  # the folder is remembered for the session
        await pilot.pause()
        assert app.screen.query_one("#folder", Input).value == str(folder)


async def test_a_folder_without_bundles_is_one_line_in_the_form(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("g")
        await pilot.pause()
        form = app.screen
        await pilot.press("ctrl+s")  # nothing typed
        await pilot.pause()
        assert app.screen is form and "folder: empty" in str(form.query_one("#form-error").render())
        await pilot.press(*str(empty), "ctrl+s")
        await pilot.pause()
        said = str(form.query_one("#form-error").render())
        assert app.screen is form and "\n" not in said
        assert said == f"{empty}: no bundles in it (files named *.bundle.tgz: `pictl bundle RUN`)"
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, BoardForm)
