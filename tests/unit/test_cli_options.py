"""One set of options everywhere: `--hosts`, `--runs-dir`, `--json`, `--headless`, `--wait` and `-v` mean the
same on every registered command that takes them, the commands that should take them do, and each may come
before the command name as well as after it."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from pictl.cli import SHARED_FLAGS, app, hoisted

VALUE_OPTIONS = ("--hosts", "--runs-dir")
TAKES = {
    "--hosts": {"run", "sweep", "train", "prune", "profile", "check", "push", "provision", "warm", "stop", "trust",
                "hosts"},
    "--runs-dir": {"run", "sweep", "train", "prune", "runs", "runs show", "runs compare", "runs export", "report",
                   "traces"},
    "--json": {"run", "sweep", "train", "prune", "profile", "check", "warm", "runs", "runs show", "runs compare",
               "hosts", "profiles"},
    "--headless": {"run", "sweep", "train", "prune"},
    "--wait": {"run", "sweep", "train", "prune", "profile", "push", "provision"},
    "--verbose": {"run", "sweep", "train", "prune", "provision"},
}


def _commands() -> dict[str, Any]:
    """Every registered command by its path (`runs show`), as the CLI's parser (Typer's click) sees it."""
    root = typer.main.get_command(app)
    found: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, cmd in group.commands.items():
            found[f"{prefix}{name}"] = cmd
            if hasattr(cmd, "commands"):
                walk(cmd, f"{prefix}{name} ")

    walk(root, "")
    return found


def _option(cmd: Any, flag: str) -> Any:
    return next((p for p in cmd.params if p.param_type_name == "option" and flag in p.opts), None)


def test_every_command_that_should_take_a_shared_option_takes_it_with_one_meaning() -> None:
    commands = _commands()
    assert {"run", "sweep", "train", "prune", "runs show", "check"} <= set(commands)
    for flag, names in TAKES.items():
        missing = sorted(n for n in names if _option(commands[n], flag) is None)
        assert not missing, f"{flag} is missing on: {', '.join(missing)}"
        kinds = {(o.is_flag, tuple(sorted(o.opts))) for n, c in commands.items() if (o := _option(c, flag))}
        assert len(kinds) == 1, f"{flag} means different things: {kinds}"
        assert next(iter(kinds))[0] is (flag not in VALUE_OPTIONS)
    assert _option(commands["run"], "-v") is not None and "-v" in _option(commands["run"], "--verbose").opts


@pytest.mark.parametrize("flag", [f for f in SHARED_FLAGS if f != "-v"])
def test_a_shared_flag_before_the_command_is_parsed_by_the_command(flag: str) -> None:
    commands = _commands()
    for name in sorted(n for n in TAKES[flag] if n in commands):
        path = name.split()
        argv = hoisted([flag, *path, "--help"])
        assert argv[:len(path)] == path and flag in argv[len(path):], argv
        cmd = commands[name]
        ctx = cmd.make_context(name, [a for a in argv[len(path):] if a != "--help"], resilient_parsing=True)
        option = _option(cmd, flag)
        assert option is not None and ctx.params[option.name] is True, (name, flag)


def test_hoisting_leaves_values_and_the_dashboard_alone() -> None:
    assert hoisted(["--hosts", "pis.toml", "--json", "runs"]) == ["--hosts", "pis.toml", "runs", "--json"]
    assert hoisted(["--runs-dir", "--json", "run"]) == ["--runs-dir", "--json", "run"]  # a value, not a flag
    assert hoisted(["--hosts", "pis.toml"]) == ["--hosts", "pis.toml"]  # no command: the dashboard
    assert hoisted(["run", "--json"]) == ["run", "--json"]
