"""The dashboard under a real Textual Pilot: real runs (local cluster, real torchrun), real traces."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from support.clusters import processes_under, write_cluster
from textual.widgets import DataTable, Input, RichLog, Select, Sparkline

from pictl.inventory import load_cluster
from pictl.jobs.sweep_rounds import RoundsPlan
from pictl.run.baselines import BaselineCache
from pictl.tui.app import PictlApp
from pictl.tui.messages import LogLine
from pictl.tui.widgets.confirm import Confirm
from pictl.tui.widgets.help_screen import HelpScreen
from pictl.tui.widgets.history import HistoryScreen
from pictl.tui.widgets.run_form import RunForm
from pictl.tui.widgets.run_panel import RunPanel
from pictl.tui.widgets.stage_panel import StagePanel
from pictl.verdict import shown_status

SIZE = (150, 50)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> BaselineCache:
    """The real runs here share one serial baseline (same images, same hosts)."""
    return BaselineCache(tmp_path_factory.mktemp("baselines"))


@pytest.fixture(autouse=True)
def _cache_of_the_module(module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cost profiles, plans and links in a cache of this module's (shared by its tests as the baselines are),
    never the user's own: a run here neither reads what an earlier session left nor leaves anything behind."""
    monkeypatch.setenv("PICTL_CACHE_DIR", str(module_cache))


def _app(tmp_path: Path, hosts: int = 2, baselines: BaselineCache | None = None, **kwargs) -> PictlApp:  # noqa: ANN003
    cluster = load_cluster(write_cluster(tmp_path / "cluster", hosts))
    cache = baselines or BaselineCache(tmp_path / "baselines")
    return PictlApp(cluster, runs_root=tmp_path / "runs", baseline_cache=cache, **kwargs)


def _profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> str:
    """A profile of the test's own, offered by the run form (the user's presets directory, the test's)."""
    presets = tmp_path / "presets"
    presets.mkdir(exist_ok=True)
    (presets / f"{name}.toml").write_text(f'description = "{name}"\n{body}\n')
    monkeypatch.setenv("PICTL_PROFILES_DIR", str(presets))
    return name


async def _start_from_form(pilot, stages: str, images: str, profile: str | None = None) -> None:  # noqa: ANN001
    await pilot.press("r")
    await pilot.pause()
    form = pilot.app.screen
    assert isinstance(form, RunForm)
    if profile is not None:
        form.query_one("#profile", Select).value = profile
    form.query_one("#stages", Input).value = stages
    form.query_one("#images", Input).value = images
    form.query_one("#policy", Select).value = "equal"  # balanced (the default) is tested in test_balanced
    await pilot.click("#start")
    await pilot.pause()
    assert not isinstance(pilot.app.screen, RunForm), pilot.app.screen.query_one("#form-error").render()


async def _until(pilot, condition, timeout: float = 240, step: float = 0.2) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the dashboard"
        await pilot.pause(step)


def _detail_text(app: PictlApp) -> str:
    """The history screen's details pane, whole, as text."""
    from rich.console import Console
    from textual.widgets import Static

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.screen.query_one("#history-detail", Static).content)
    return console.export_text()


def _screen_text(app: PictlApp) -> str:
    """What the terminal shows, as text (from Textual's own screenshot)."""
    import html
    import re

    svg = app.export_screenshot()
    text = html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ")
    return " ".join(text.split())  # the SVG splits a line into runs of text: compare words, not spacing


def _run_panel_text(app: PictlApp) -> str:
    """The run panel's rows, whole, as text: under load the flags can push the last rows below its fold."""
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.query_one("#summary", RunPanel).content)
    return console.export_text()


def _panel_text(app: PictlApp, rank: int) -> str:
    return str(app.query_one(f"#stage-{rank}", StagePanel).query_one(".stage-figures").render())


@pytest.mark.slow
async def test_run_from_the_form_live_panels_traces_and_history(tmp_path: Path, baselines, monkeypatch) -> None:
    # No warm-up pass and two timed passes of DeiT-Ti (a profile of the test's own): what is followed here is the
    # launch, the timed passes and the traces (one pass traced, one not), not the model, and the serial baseline
    # measures as many passes as the pipeline: each pass left out is its images twice. 96 images of DeiT-Ti are
    # half the work of DeiT-S's 48 (a quarter of the model, twice the images), and a pass still lasts seconds.
    no_warmup = _profile(tmp_path, monkeypatch, "no-warmup",
                         'model = "deit_tiny_patch16_224"\nwarmup = 0\nrepeats = 2')
    app = _app(tmp_path, baselines=baselines)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")  # no run yet: a notice, nothing else
        await pilot.pause()
        assert any("no pipeline is running" in n.message for n in app._notifications)
        # 96 images: on a quiet machine a pass lasts several of the dashboard's once-a-second progress draws,
        # so the sparkline below has points to gain (24 images of DeiT-S passed in about 2 s here: one point).
        await _start_from_form(pilot, "2", "96", profile=no_warmup)
        assert app.state.running and sorted(app.state.stages) == [0, 1]
        # While it launches or measures the baseline, the run line turns a spinner and counts the seconds.
        await _until(pilot, lambda: re.search(r"run [⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] \w+: .*\(\d+s\)", _screen_text(app)), timeout=60)
        assert app.state.run_dir and Path(app.state.run_dir).name in _screen_text(app).replace(" ", "")
        # Traces grabbed in the timed passes (not the warm-up or balanced's calibration passes), so one is
        # marked as traced and kept out of the figures.
        await _until(pilot, lambda: app.state.stages[1].phase == "timed" and app.session.pipeline_live)
        assert app.session.options.warmup == 0 and app.session.options.repeats == 2
        seen = []  # the panels change while the run goes on
        activity = set()  # and the host table says what each host is doing (the last pass may end meanwhile)
        hosts = app.query_one("#hosts", DataTable)
        await pilot.press("t")
        for _ in range(10):
            await pilot.pause(0.3)
            seen.append(_panel_text(app, 1))
            activity.add(str(hosts.get_cell("h0", "activity")))
        assert len(set(seen)) > 1 and "microbatches" in seen[-1]
        assert activity & {"running", "waiting"}, activity
        await _until(pilot, lambda: not app.state.running and app.state.traces)
        # The throughput sparkline gained a point at each progress draw (once a second) while the run went on.
        assert len(app.query_one("#stage-1", StagePanel).query_one(Sparkline).data) > 1
        s = app.state.summary
        assert app.state.phase == "done" and s is not None and s.status == "ok" and s.outputs_match is True
        assert "match" in _screen_text(app)
        grab = app.state.traces[0]
        assert sorted(grab.files) == ["0", "1"] and not grab.missing
        assert all(Path(f).exists() for f in grab.files.values()) and Path(grab.timeline or "").exists()
        assert (s.traced_passes or 0) >= 1
        # The per-rank breakdown from the traces, in the run panel (on screen unless flags fill it first).
        try:
            await _until(pilot, lambda: "rank 1: compute" in _run_panel_text(app), timeout=20)
        except AssertionError:
            raise AssertionError(f"the run panel holds:\n{_run_panel_text(app)}") from None
        assert "rank 1: compute" in _screen_text(app) or s.flags, _screen_text(app)
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        table = app.screen.query_one(DataTable)
        # the status the run panel showed (suspect where load raised a flag)
        assert table.row_count == 1 and str(table.get_cell("0", "status")) == shown_status(s)
        await pilot.press("enter")
        # What the details pane holds (on a loaded machine, flags can push the traces' rows below its fold).
        try:
            await _until(pilot, lambda: "rank 0: compute" in _detail_text(app), timeout=20)
        except AssertionError:
            raise AssertionError(f"the details pane holds:\n{_detail_text(app)}") from None
        detail = _detail_text(app)
        assert s.run_id in detail and "traces" in detail and "rank 0: compute" in detail
        await pilot.press("escape")
        assert not isinstance(app.screen, HistoryScreen)


@pytest.mark.slow
async def test_stop_and_quit_ask_first_and_leave_nothing_running(tmp_path: Path, baselines, monkeypatch) -> None:
    # The stop is the subject, not the model: DeiT-Ti with no warm-up pass (a profile of the test's own, chosen in
    # the form) makes the serial baseline a run measures first (again whenever other work loaded the machine) three
    # passes of a quarter of DeiT-S's work, and its pipeline, stopped at its first microbatches, still has 144 of
    # them to go.
    tiny = _profile(tmp_path, monkeypatch, "tiny", 'model = "deit_tiny_patch16_224"\nwarmup = 0')
    app = _app(tmp_path, baselines=baselines)
    async with app.run_test(size=SIZE) as pilot:
        await _start_from_form(pilot, "2", "48", profile=tiny)
        await _until(pilot, lambda: app.session.pipeline_live and app.state.stages[0].microbatches > 0)
        assert app.session.options.model == "deit_tiny_patch16_224"
        for quit_key in ("q", "ctrl+q"):  # ctrl+q (and the palette's Quit) ask too
            await pilot.press(quit_key)
            await pilot.pause()
            assert isinstance(app.screen, Confirm), quit_key
            await pilot.press("n")  # keep going
            await pilot.pause()
            assert app.state.running and app.is_running
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        await pilot.press("y")
        await _until(pilot, lambda: not app.state.running, timeout=60)
        assert app.state.phase == "stopped"
        assert app.state.summary is not None and app.state.summary.status == "interrupted"
        assert not processes_under(tmp_path / "cluster")
        assert str(app.query_one("#hosts", DataTable).get_cell("h1", "activity")) == "stopped"


async def test_log_filter_by_host_rank_and_text(tmp_path: Path) -> None:
    app = _app(tmp_path, hosts=3, monitor=False)
    async with app.run_test(size=SIZE) as pilot:
        for host, source, line in (("h0", "h0", "loading weights"), ("h1", "rank1", "ready: blocks.6 .. head"),
                                   ("h1", "h1", "Traceback: boom"), ("h2", "rank2", "pass 1: 3.2 img/s")):
            app.post_message(LogLine(source, host, "stdout", line))
        await pilot.pause()
        log = app.query_one("#log-lines", RichLog)
        assert len(log.lines) == 4
        await pilot.press("slash")
        await pilot.press(*"host:h1")
        await pilot.pause()
        assert len(log.lines) == 2
        await pilot.press("space", *"rank:1")
        await pilot.pause()
        assert len(log.lines) == 1 and "ready" in log.lines[0].text
        await pilot.press("escape")
        await pilot.pause()
        assert len(log.lines) == 4
        await pilot.press("slash", *"IMG/S", "enter")
        await pilot.pause()
        assert len(log.lines) == 1 and "h2/rank2" in log.lines[0].text


async def test_a_host_that_drops_turns_red(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text('[cluster]\nname = "t"\n[[host]]\nname = "ok"\ntransport = "local"\n'
                   f'workdir = "{tmp_path}/ok"\n[[host]]\nname = "gone"\ntransport = "ssh"\n'
                   'address = "127.0.0.1"\nport = 9\n')
    app = PictlApp(load_cluster(inv), runs_root=tmp_path / "runs")
    async with app.run_test(size=SIZE) as pilot:
        started = time.monotonic()
        await _until(pilot, lambda: app.state.hosts["gone"].up is False and app.state.hosts["ok"].up, timeout=15)
        assert time.monotonic() - started < 8
        # The table shows it at its next refresh (later on a loaded machine: ci33 read the cell still "...").
        table = app.query_one("#hosts", DataTable)
        await _until(pilot, lambda: table.get_cell("gone", "link").plain == "DOWN", timeout=15)
        assert "red" in str(table.get_cell("gone", "link").style)


async def test_keys_are_listed_in_help_and_the_palette(tmp_path: Path) -> None:
    app = _app(tmp_path, monitor=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_screen = app.screen.query_one("#help")
        text = ""
        while True:  # read it all: on 80x24 the help scrolls
            text += " " + _screen_text(app)
            if help_screen.scroll_y >= help_screen.max_scroll_y:
                break
            help_screen.scroll_page_down(animate=False)
            await pilot.pause()
        for said in ("start a run", "stop the run", "grab torch.profiler traces", "past runs", "quit (asks first",
                     "speedup against", "host:NAME rank:N", "stages=N policy=NAME"):
            assert said in text, said
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Run", "Stop", "Traces", "History", "Filter logs"} <= set(commands)
        await pilot.press("s")  # nothing to stop: a notice, no dialog
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


@pytest.mark.slow
async def test_a_sweep_from_the_dashboard_shows_its_table(tmp_path: Path, baselines, monkeypatch) -> None:
    # DeiT-Ti (a profile of the test's own, chosen in the form): the form, the table and its reference are the
    # subject, not the model; its reference and its pipeline build and run a quarter as much.
    tiny = _profile(tmp_path, monkeypatch, "tiny", 'model = "deit_tiny_patch16_224"')
    app = _app(tmp_path, baselines=baselines)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("w")
        await pilot.pause()
        form = app.screen
        form.query_one("#profile", Select).value = tiny
        stages = form.query_one("#stages", Input)
        stages.value = "1,9"
        stages.focus()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form and "9 stages do not fit" in str(form.query_one("#form-error").render())
        stages.value = "2"  # one round of one configuration is enough to follow (the CLI's sweep test runs several)
        form.query_one("#images", Input).value = "4"
        app.sweep_rounds = RoundsPlan(1, 1)
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: app.state.sweep and len(app.state.sweep.rows) == 1
                     and not app.state.running)
        await pilot.pause(0.6)
        rows = app.state.sweep.rows  # (the last table: the sweep's end rewrites it)
        assert [(r["stages"], r["status"]) for r in rows] == [(2, "ok")]
        text = _screen_text(app)
        assert "run 2 of 2" in text and "interval" in text  # the reference, then the configuration
        # place, the median speedup, its interval over rounds (none from one round), efficiency; and the one
        # reference every speedup divides by, under the table
        row = rf"\b1 +2 equal c\d+ +[\d.]+ +{rows[0]['speedup']:.2f}x +- +{rows[0]['efficiency']:.2f}"
        assert re.search(row, text), text
        assert "speedups over one reference: serial on h0" in " ".join(text.split()), text
        assert (Path(app.state.sweep.directory) / "table.md").exists()


@pytest.mark.slow
async def test_a_tune_from_the_dashboard_follows_each_candidate_and_saves_the_winner(tmp_path: Path, baselines,
                                                                                    monkeypatch) -> None:
    """u: the tune's form (a bad field named as the form names it), then each candidate's run on the panel with
    the ranked table above it, and the winner saved as the `tuned` preset the run form then offers."""
    from pictl.tui.widgets.tune_form import TuneForm

    # DeiT-Ti (a profile of the test's own, chosen in the form): the form, the candidates' runs followed on the
    # panel and the saved winner are the subject, not the model; every run builds and measures a quarter as much.
    tiny = _profile(tmp_path, monkeypatch, "tiny", 'model = "deit_tiny_patch16_224"')
    app = _app(tmp_path, baselines=baselines)
    app.profiles_dir = tmp_path / "profiles"
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("u")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, TuneForm)
        form.query_one("#profile", Select).value = tiny
        images = form.query_one("#images", Input)
        images.value = "0"
        images.focus()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form and "images per pass" in str(form.query_one("#form-error").render())
        for field, value in (("#images", "4"), ("#threads", "1"), ("#chunk", "1"), ("#measure", "2"),
                             ("#max_rounds", "3")):
            form.query_one(field, Input).value = value  # threads and chunk fixed: the shapes alone, kept short
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: app.state.tune is not None and app.state.tune.trying != "")
        assert app.state.tune.trying.startswith("1x2")  # the pipeline over both hosts comes first
        await _until(pilot, lambda: (Path(app.state.tune.directory) / "table.md").is_file() and not app.state.running,
                     timeout=480)
        tune = app.state.tune
        assert tune.base.model == "deit_tiny_patch16_224"
        assert tune.measured == 2 and all(m.status == "ok" for m in tune.rows if m.status)
        assert all(len(m.rounds) == 3 for m in tune.rows if m.rounds)  # the reference and the finalists, 3 rounds
        await pilot.pause(0.6)
        text = _screen_text(app)
        assert "2 measured" in text
        for m in tune.rows:  # each row measured in rounds shows its speedup's interval beside its median
            if m.interval:
                assert f"{m.interval[0]:.2f}-{m.interval[1]:.2f}" in text, (m.interval, text)
        if tune.winner is None:  # the rounds could not tell a candidate from the serial run: nothing is saved
            assert tune.preset is None and not (tmp_path / "profiles" / "tuned.toml").exists()
            return
        assert tune.preset == tmp_path / "profiles" / "tuned.toml" and tune.preset.is_file()
        assert "WINNER" in text and tune.winner.candidate.short(tune.base) in text and "saved as" in text


@pytest.mark.slow
async def test_a_pruning_job_from_the_dashboard(tmp_path: Path) -> None:
    from support.digits import write_digits

    from pictl.tui.widgets.prune_form import PruneForm

    data = write_digits(tmp_path / "digits")
    app = _app(tmp_path, monitor=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        form = pilot.app.screen
        assert isinstance(form, PruneForm)
        form.query_one("#model", Input).value = "vit_tiny_patch16_224"
        form.query_one("#model-args", Input).value = "img_size=32,patch_size=8,depth=2,embed_dim=48,num_heads=4"
        form.query_one("#data", Select).value = "imagefolder"
        form.query_one("#ratio", Input).value = "1.5"
        await pilot.click("#start")
        await pilot.pause()
        assert isinstance(pilot.app.screen, PruneForm), "a ratio of 1.5 was accepted"
        assert "ratio" in str(form.query_one("#form-error").render())
        form.query_one("#ratio", Input).value = "0.3"
        form.query_one("#data-path", Input).value = str(data)
        form.query_one("#importance", Select).value = "l1"
        form.query_one("#epochs", Input).value = "1"
        form.query_one("#epochs", Input).focus()
        await pilot.press("ctrl+s")  # from any field, as in the run form (Enter goes to the next field)
        await pilot.pause()
        assert not isinstance(pilot.app.screen, PruneForm), form.query_one("#form-error").render()
        await _until(pilot, lambda: app.state.prune and app.state.prune.accuracy, timeout=120)
        assert "top-1 before" in _screen_text(app)  # streamed while the job runs
        await _until(pilot, lambda: not app.state.running, timeout=120)
        await pilot.pause(0.6)
        summary = app.state.prune.summary
        assert summary and summary.status == "ok", app.state.phase_message
        screen = _screen_text(app)
        assert "top-1 epoch 1" in screen and "result top-1" in screen, screen
        assert Path(summary.artifact or "").is_file()
        assert str(tmp_path / "prunes") in (summary.artifact or "")


async def test_history_sorts_filters_compares_and_exports(tmp_path: Path) -> None:
    """Three recorded runs (a real summary, varied): sort by speedup, filter, mark two and compare, export."""
    import json

    real = json.loads((Path(__file__).parents[1] / "support" / "data" / "run_summary_two_stages.json").read_text())
    for i, (stages, policy, speedup) in enumerate(((2, "equal", 1.41), (4, "balanced", 3.3), (2, "balanced", 1.7))):
        run_id = f"2026112{i}-120000-s{stages}-abc{i}"
        run_dir = tmp_path / "runs" / run_id
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text("{}")
        (run_dir / "summary.json").write_text(json.dumps({**real, "run_id": run_id, "run_dir": str(run_dir),
                                                          "stages": stages, "policy": policy, "speedup": speedup,
                                                          "started_at": time.time() - 86400 * (3 - i)}))
    app = _app(tmp_path, monitor=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        table = screen.query_one(DataTable)

        def column(key: str) -> list[str]:
            return [str(table.get_cell_at((r, [k for _, k in COLUMNS].index(key)))) for r in range(table.row_count)]

        from pictl.tui.widgets.history import COLUMNS

        assert column("speedup") == ["1.70x", "3.30x", "1.41x"]  # newest first, as every view writes a speedup
        await pilot.press("s")  # by speedup
        await pilot.pause()
        assert column("speedup") == ["3.30x", "1.70x", "1.41x"]
        await pilot.press("slash", *"policy=balanced", "enter")
        await pilot.pause()
        assert column("policy") == ["balanced", "balanced"]
        await pilot.press("space", "down", "space", "c")
        await pilot.pause()
        detail = _screen_text(app)
        assert "20261121-120000-s4-abc1" in detail and "20261122-120000-s2-abc2" in detail and "efficiency" in detail
        await pilot.press("e")
        await pilot.pause()
        exported = list((tmp_path).glob("runs-*.csv"))
        assert len(exported) == 1 and len(exported[0].read_text().splitlines()) == 3  # header + the 2 shown
        await pilot.press("slash")
        await pilot.press(*"nonsense=1")
        await pilot.pause()
        assert "filter: 'nonsense=1'" in _screen_text(app)
