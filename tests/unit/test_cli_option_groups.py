"""Options declared once: no command's function takes more than 25 parameters as written (what several commands
share comes as one option group, `pictl.cli.option_groups`), a shared group reaches every command that takes it
with one meaning, no option is typed out twice, and `@grouped` gives Typer the group's options in its place."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, get_args, get_origin, get_type_hints

import pytest
import typer
from typer.models import OptionInfo
from typer.testing import CliRunner

from pictl.cli import app
from pictl.cli.option_groups import HostFlags, MeasureFlags, OptionGroup, OutputFlags, grouped

MOST_PARAMETERS = 25
SHARED_GROUPS = (MeasureFlags, HostFlags, OutputFlags)


def _functions() -> dict[str, Callable[..., Any]]:
    """Every registered command's function by its path (`runs show`; the app's and a group's callback by the
    group's path, "" for `pictl` itself)."""
    found: dict[str, Callable[..., Any]] = {}

    def walk(typer_app: typer.Typer, prefix: str) -> None:
        if typer_app.registered_callback is not None and typer_app.registered_callback.callback is not None:
            found[prefix.strip()] = typer_app.registered_callback.callback
        for info in typer_app.registered_commands:
            assert info.callback is not None
            found[prefix + (info.name or typer.main.get_command_name(info.callback.__name__))] = info.callback
        for group in typer_app.registered_groups:
            assert group.typer_instance is not None
            walk(group.typer_instance, f"{prefix}{group.name} ")

    walk(app, "")
    return found


def _click_commands() -> dict[str, Any]:
    """The same commands as the parser (Typer's click) builds them, by path."""
    found: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        found[path] = cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


def _declaration(hint: Any) -> OptionInfo | None:
    """The `typer.Option(...)` an option's annotation carries (None: not an option)."""
    if get_origin(hint) is not Annotated:
        return None
    return next((m for m in get_args(hint)[1:] if isinstance(m, OptionInfo)), None)


def _groups_taken(function: Callable[..., Any]) -> list[type[OptionGroup]]:
    hints = get_type_hints(inspect.unwrap(function))
    return [h for h in hints.values() if isinstance(h, type) and issubclass(h, OptionGroup)]


def _meaning(param: Any) -> tuple[Any, ...]:
    """What a person and the parser see of an option: its spellings, help, panel, default, whether hidden."""
    return (tuple(param.opts), tuple(param.secondary_opts), param.help, param.rich_help_panel, param.default,
            param.hidden, param.is_flag, param.multiple)


def test_every_command_function_takes_at_most_25_parameters_as_written() -> None:
    functions = _functions()
    assert {"", "run", "train", "sweep", "prune", "tune", "runs show", "check"} <= set(functions)
    counts = {path: len(inspect.signature(inspect.unwrap(f)).parameters) for path, f in functions.items()}
    over = {path: n for path, n in counts.items() if n > MOST_PARAMETERS}
    assert not over, f"commands over {MOST_PARAMETERS} parameters (group the options they share): {over}"
    # Grouped, they still take every option: `pictl run` has far more options than parameters.
    assert len(_click_commands()["run"].params) > 3 * counts["run"]


@pytest.mark.parametrize("group", SHARED_GROUPS, ids=lambda g: g.__name__)
def test_a_shared_group_reaches_every_command_that_takes_it_with_its_one_declaration(
        group: type[OptionGroup]) -> None:
    commands = _click_commands()
    takers = [path for path, f in _functions().items() if any(issubclass(g, group) for g in _groups_taken(f))]
    assert len(takers) >= 2, f"{group.__name__} is shared by {takers} only"
    hints = get_type_hints(group, include_extras=True)
    for field in dataclasses.fields(group):
        declared = _declaration(hints[field.name])
        assert declared is not None, f"{group.__name__}.{field.name} is not an option"
        params = [next(p for p in commands[path].params if p.name == field.name) for path in takers]
        meanings = {_meaning(p) for p in params}
        assert len(meanings) == 1, f"{group.__name__}.{field.name} means different things: {meanings}"
        assert {(p.help, p.rich_help_panel) for p in params} == {(declared.help, declared.rich_help_panel)}


def test_no_option_is_typed_out_twice() -> None:
    """Two commands' options that read the same (spellings, help, panel, default, type) come from one
    declaration, not from two copies that can drift apart."""
    commands = _click_commands()
    declarations: dict[tuple[Any, ...], set[int]] = {}
    where: dict[tuple[Any, ...], list[str]] = {}
    for path, function in _functions().items():
        hints = get_type_hints(function, include_extras=True)  # a grouped command's: the groups' options spread
        for param in commands[path].params:
            declared = _declaration(hints.get(param.name))
            if declared is None:
                continue
            key = (*_meaning(param), get_args(hints[param.name])[0])
            declarations.setdefault(key, set()).add(id(declared))
            where.setdefault(key, []).append(f"{path or 'pictl'} {param.opts[0]}")
    assert sum(len(w) for w in where.values()) > 150  # (every command's options were read)
    copies = {tuple(where[key]) for key, ids in declarations.items() if len(ids) > 1}
    assert not copies, f"options declared more than once: {sorted(copies)}"


def test_grouped_gives_typer_the_group_in_its_place_and_the_command_the_group() -> None:
    demo = typer.Typer()
    seen: list[tuple[Any, ...]] = []

    @demo.command()
    @grouped
    def show(first: Annotated[int, typer.Option()] = 1, *, measure: MeasureFlags, where: HostFlags,
             last: Annotated[Optional[str], typer.Option()] = None) -> None:
        seen.append((first, measure, where, last))

    assert list(inspect.signature(show).parameters) == [
        "first", "images", "warmup", "repeats", "threads", "hosts", "wait", "cold", "runs_dir", "last"]
    assert list(inspect.signature(inspect.unwrap(show)).parameters) == ["first", "measure", "where", "last"]
    result = CliRunner().invoke(demo, ["--images", "5", "--wait", "--last", "x", "--runs-dir", "/tmp/r"])
    assert result.exit_code == 0, result.output
    assert seen == [(1, MeasureFlags(images=5), HostFlags(wait=True, runs_dir=Path("/tmp/r")), "x")]
    assert CliRunner().invoke(demo, ["--runs-dir", ""]).exit_code == 2  # the shared parser refuses an empty path


def test_grouped_refuses_an_option_that_two_declarations_would_fight_over() -> None:
    with pytest.raises(TypeError, match="wait named twice"):
        @grouped
        def clash(wait: Annotated[bool, typer.Option()] = False, *, where: HostFlags) -> None: ...
    with pytest.raises(TypeError, match="images named twice"):
        @grouped
        def shadow(*, images: MeasureFlags) -> None: ...
