"""The `pictl` command: parses arguments, runs a session, maps errors to exit codes.

Each command lives with its kind (`run`: the dashboard, `pictl run` and its presets; `results`: `pictl traces`
and `pictl report`; `runs`: `pictl runs`, past runs as data; `jobs`: sweeps and pruning; `tune`; `train`;
`costs`: what `balanced` measures; `hosts`: the inventory, readiness, code, keys; `provision`: venvs; `init`:
a new inventory; `grading`: bundle, verify, board); `common` holds what they share (the app, one-line errors,
signals, connections) and `option_groups` the options several commands take, declared once.

Exit codes: 0 ok, 1 internal error, 2 bad input or config (nothing started),
3 a run failed on a host, 4 a host could not be reached, 5 pipeline output differs
from the serial run, 6 a host is not ready (python, venv, packages: see `pictl check`
and `pictl provision`), 7 the run raised sanity flags under `--strict`, 8 a host is busy (another run
holds its lease), 9 a measured result's record could not be written whole (printed first), 10 the result is
SUSPECT (a speedup no exact pipeline reaches, a serial baseline something else slowed); `pictl verify`: 11 signature,
12 a member changed after signing, 13 the code is not the run's, 14 the preset's rules broken, 15 the speedup not
reproduced (5: its outputs or accuracy differ); 130 interrupted
(Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import sys

from rich.console import Console

from pictl import errors as E
from pictl.cli.common import app
from pictl.text import printable

# isort: off
# Each command module registers its commands on `app` when imported: `pictl --help` lists them in this order.
from pictl.cli import run, results, runs, jobs, tune, train, generate, costs, hosts, provision, init, grading  # noqa: E402, F401, E501

# isort: on
COMMAND_MODULES = (run, results, runs, jobs, tune, train, costs, hosts, provision, init, grading)

__all__ = ["app", "entrypoint"]

_DEBUG_ON = ("1", "true", "yes")
"""PICTL_DEBUG values (any case) that show a bug's traceback; anything else, `0` and `false` included, is off."""


SHARED_FLAGS = ("--json", "--headless", "--wait", "--verbose", "-v")
"""Flags that mean the same on every command that takes them, and may come before the command name as well as
after it (`pictl --json runs`); `--hosts` and `--runs-dir` too (the main callback takes those)."""


def hoisted(argv: list[str]) -> list[str]:
    """`argv` with the shared flags given before the command moved after it (where the command parses them:
    one meaning, one place). Anything else before the command stays where it is."""
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        token = argv[i]
        if token in SHARED_FLAGS:
            moved.append(token)
        else:
            rest.append(token)
            if token in ("--hosts", "--runs-dir") and i + 1 < len(argv):  # (their value is not a command)
                i += 1
                rest.append(argv[i])
        i += 1
    if i == len(argv) or not moved:  # no command after them (the dashboard): leave them to the callback
        return argv
    return [*rest, *argv[i:], *moved]


def entrypoint() -> None:
    import typer

    _escape_what_the_terminal_cannot_show()
    try:
        code = app(args=hoisted(sys.argv[1:]), standalone_mode=False)
    except typer.Abort:  # Ctrl-C at a prompt
        sys.exit(E.EXIT_INTERRUPTED)
    except typer.TyperException as exc:  # a flag or value the command refuses: one line, like every other error
        ctx = getattr(exc, "ctx", None)
        sub = ctx.command_path[len(ctx.find_root().info_name or ""):].strip() if ctx else ""
        where = f" (see `pictl {sub + ' ' if sub else ''}-h`)" if ctx else ""
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"pictl: error: {printable(message)}{where}", markup=False, emoji=False)
        sys.exit(getattr(exc, "exit_code", E.EXIT_BAD_INPUT))
    except KeyboardInterrupt:
        sys.exit(E.EXIT_INTERRUPTED)
    except Exception as exc:  # a bug in pictl: one line here, the traceback in a file (PICTL_DEBUG=1 shows it)
        import os

        if os.environ.get("PICTL_DEBUG", "").strip().lower() in _DEBUG_ON:
            raise
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"pictl: error: internal error (a bug in pictl): {type(exc).__name__}: {exc}; "
            f"{_save_traceback(exc)}", markup=False)
        sys.exit(E.EXIT_INTERNAL)
    sys.exit(code if isinstance(code, int) else 0)


def _escape_what_the_terminal_cannot_show() -> None:
    """A locale or terminal that is not UTF-8 (`LANG=C` on an old system, `PYTHONIOENCODING=ascii`) cannot take
    every character a record or a table holds: what it cannot take is written escaped (`\\xe9`), not the end of
    the command in UnicodeEncodeError; tables are drawn in ASCII there (Rich reads the stream's encoding)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _save_traceback(exc: BaseException) -> str:
    import time
    import traceback

    import platformdirs

    try:
        path = platformdirs.user_log_path("pictl") / "internal-errors.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pictl {' '.join(sys.argv[1:])}\n")
            fh.write("".join(traceback.format_exception(exc)))
        return f"traceback in {path}"
    except OSError:
        return "run again with PICTL_DEBUG=1 for the traceback"
