"""The forms under the real Textual Pilot: Enter in a field goes on to the next one and never starts anything;
ctrl+s starts from any field; at 80x24 and 120x36 (where the run form scrolls) its title with the keys and the
footer's keys stay in view, and Tab still goes through the fields in order, then the buttons."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from support.clusters import write_cluster
from textual.events import Key
from textual.widgets import Input, Select

from pictl.inventory import load_cluster
from pictl.tui.app import PictlApp
from pictl.tui.widgets.run_form import RunForm
from pictl.tui.widgets.sweep_form import SweepForm


def _app(tmp_path: Path) -> PictlApp:
    return PictlApp(load_cluster(write_cluster(tmp_path / "cluster", 2)), runs_root=tmp_path / "runs", monitor=False)


def _screen_text(app: PictlApp) -> str:
    svg = app.export_screenshot()
    return " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())


async def test_enter_in_a_field_goes_on_and_ctrl_s_starts(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("r")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, RunForm) and app.focused is form.query_one("#stages", Input)
        await pilot.press("0", "enter")  # a bad value, and the Enter that used to submit it
        await pilot.pause()
        assert app.screen is form and app.session is None and not app.state.running
        assert app.focused is form.query_one("#policy", Select)  # the next field
        assert str(form.query_one("#form-error").render()) == ""  # nothing was submitted
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form and "stages" in str(form.query_one("#form-error").render())  # submitted, refused
        assert app.session is None


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_the_keys_stay_in_view(size: tuple[int, int], tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await pilot.press("r")
        await pilot.pause()
        form = app.screen
        form.query_one("#images", Input).focus()  # the last field: the form scrolls down to it
        await pilot.pause()
        assert form.query_one("#run-form").max_scroll_y > 0, "the form fits: this test shows nothing"
        packed = _screen_text(app).replace(" ", "")  # (the SVG splits a line where its style changes)
        assert "Startarun(ctrl+s:start,Esc:cancel)" in packed, packed  # the title, pinned on top
        assert "esccancel^sstart" in packed  # the footer
        chain = [w.id for w in app.screen.focus_chain]
        assert chain == ["profile", "stages", "policy", "split", "chunk", "images", "start", "cancel"], chain


async def test_every_form_moves_on_with_enter(tmp_path: Path) -> None:
    """The forms share the behaviour: the sweep's too."""
    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("w")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, SweepForm)
        first = app.focused
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is form and app.focused is not first


async def test_keys_typed_after_enter_land_where_enter_moved_to(tmp_path: Path) -> None:
    """Enter moves on as the key is read, like Tab: the keys typed right after it, before the dashboard has
    drawn anything, go to the field Enter and the Tabs lead to (stages, Enter, three Tabs: images)."""
    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, RunForm) and app.focused is app.screen.query_one("#stages", Input)
        for key in ("2", "enter", "tab", "tab", "tab", "7"):  # straight into the queue, as a terminal sends them
            app.post_message(Key(key, key if len(key) == 1 else None))
        await pilot.pause()
        form = app.screen
        assert [form.query_one(f"#{f}", Input).value for f in ("stages", "split", "chunk", "images")] == \
            ["2", "", "", "7"]
