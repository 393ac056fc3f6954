"""Every benchmark script keeps working while the code under it changes.

bench/dashboard.py had rotted unseen (the dashboard's state became typed; the script still handed it a dict
and ended in an AttributeError). So, in the suite:

- every script under bench/ is in `make bench`'s list (`python -m bench`: each script's quick mode), so
  none can be left out of it;
- every script imports and builds its command line, which offers `--quick` (`--help`, in this process);
- the quick modes that take seconds and stand on pictl's own code run whole, as `make bench` runs them:
  the dashboard's (the app, its typed state and the bridge under 4 hosts' streams), pruning's
  (`remote.pruning` and the model builder) and the verdict over the saved speedup checks.

The other quick modes (a real pictl run or several each, 10 s to minutes here, some on the SSH cluster) run
in `make bench`; in the suite, mypy type-checks every script against the code it calls (pyproject's
`[tool.mypy] files`), which is what caught the dashboard's.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys

import pytest
from support.cli import ROOT

SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in ("__init__", "__main__", "harness"))
IN_THE_SUITE = ("check_verdict", "dashboard", "prune")
"""Quick modes of seconds that stand on pictl's code (measured here: 0.5, 7 and 11 s)."""


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ runs from there (`python -m bench.NAME`)


def test_make_bench_runs_every_script() -> None:
    from bench.__main__ import QUICK

    assert sorted(QUICK) == SCRIPTS
    assert set(IN_THE_SUITE) <= set(QUICK)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_builds_its_command_line(name: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])
    with pytest.raises(SystemExit) as done:
        started = module.main()
        if inspect.iscoroutine(started):  # (the dashboard's main is a coroutine: its parser runs inside)
            asyncio.run(started)
    assert done.value.code == 0
    assert "--quick" in capsys.readouterr().out


@pytest.mark.parametrize("name", IN_THE_SUITE)
def test_quick_mode(name: str) -> None:
    from bench.__main__ import run

    verdict, seconds = run(name)
    assert verdict == "PASS", f"bench.{name} --quick: {verdict} after {seconds:.0f} s (its output is above)"
