"""Hostile and careless inputs through the real CLI: one `pictl: error:` line naming the file, field, flag
or host, the README's exit code, no traceback, and nothing started or left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT

from pictl.planning.profiles import SHIPPED_PROFILES

LOCAL = '[defaults]\ntransport = "local"\ninterface = "lo"\n'


def _pictl(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=120)


def _hosts(d: Path, body: str | bytes, name: str = "hosts.toml") -> Path:
    path = d / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return path


def _host(d: Path, extra: str = "") -> str:
    return f'{LOCAL}[[host]]\nname = "h0"\nworkdir = "{d}/h0"\n{extra}'


def _profile(d: Path, name: str, body: str | bytes) -> None:
    (d / "profiles").mkdir(exist_ok=True)
    (d / "profiles" / f"{name}.toml").write_bytes(body if isinstance(body, bytes) else body.encode())


def _run(d: Path, *args: str) -> list[str]:
    return ["run", "--headless", "--stages", "1", "--images", "2", "--hosts", str(_hosts(d, _host(d))), *args]


def _summary_dir(d: Path, content: str) -> Path:
    (d / "r").mkdir()
    (d / "r" / "summary.json").write_text(content)
    return d / "r"


def _live_run(d: Path, config: str) -> Path:
    run = d / "elsewhere" / "20991231-235959-s2-abcd"
    run.mkdir(parents=True)
    (run / "config.json").write_text(config)
    return run


Case = Callable[[Path], list[str] | tuple[list[str], dict[str, str]]]
"""Arguments (and, for some, environment variables) for one bad input, made in the test's directory."""
CASES: list[tuple[str, Case, int, str]] = [
    # hosts.toml
    ("inventory not UTF-8", lambda d: ["hosts", "--hosts", str(_hosts(d, b'[[host]]\nname = "h\xff"\n'))], 2,
     "hosts.toml: not UTF-8 text"),
    ("defaults = 5", lambda d: _run(d, "--hosts", str(_hosts(d, 'defaults = 5\n[[host]]\nname = "a"\n', "i.toml"))),
     2, "i.toml: 'defaults' must be a table"),
    ('cluster = "x"', lambda d: _run(d, "--hosts", str(_hosts(d, 'cluster = "x"\n[[host]]\nname = "a"\n', "i.toml"))),
     2, "i.toml: 'cluster' must be a table"),
    ("host = [5]", lambda d: ["hosts", "--hosts", str(_hosts(d, "host = [5]\n"))], 2,
     "hosts.toml: host[0] must be a table"),
    ('port = "22"', lambda d: _run(d, "--hosts", str(_hosts(d, _host(d, 'port = "22"\n'), "i.toml"))), 2,
     "i.toml: host[0].port: Input should be a valid integer"),
    ("slots = true", lambda d: _run(d, "--hosts", str(_hosts(d, _host(d, "slots = true\n"), "i.toml"))), 2,
     "i.toml: host[0].slots: Input should be a valid integer"),
    ('interface = "../../.."', lambda d: _run(d, "--hosts", str(_hosts(d, _host(d, 'interface = "../../.."\n'),
                                                                       "i.toml"))), 2,
     "i.toml: host[0].interface: String should match pattern"),
    ("cluster.name = 5", lambda d: ["hosts", "--hosts", str(_hosts(d, 'cluster = {name = 5}\n[[host]]\nname = "a"\n'))],
     2, "hosts.toml: cluster.name: must be a string"),
    ("--hosts that is a directory", lambda d: ["hosts", "--hosts", str(d)], 2, "inventory file not found"),
    ("trust a local host", lambda d: ["trust", "h0", "--hosts", str(_hosts(d, _host(d)))], 2,
     "host 'h0' is a local host: it has no SSH key to trust"),
    ("trust a host the inventory lacks", lambda d: ["trust", "nope", "--hosts", str(_hosts(d, _host(d)))], 2,
     "no host named 'nope'"),
    ('a host named "serial"', lambda d: ["hosts", "--hosts", str(_hosts(d, '[[host]]\nname = "serial"\n'))], 2,
     "host[0].name: 'serial' is reserved"),
    ("a local venv that does not exist", lambda d: _run(d, "--hosts", str(_hosts(
        d, _host(d, f'venv = "{d}/no-venv"\n'), "i.toml"))), 6, "host 'h0': no python at"),
    ('workdir = "/proc/x"', lambda d: _run(d, "--hosts", str(_hosts(
        d, f'{LOCAL}[[host]]\nname = "h0"\nworkdir = "/proc/x"\n', "i.toml"))), 6,
     "host 'h0': cannot use the workdir /proc/x"),
    ("a python that does not exist", lambda d: _run(d, "--hosts", str(_hosts(
        d, _host(d, 'python = "/nonexistent/python3"\n'), "i.toml"))), 6,
     "host 'h0': cannot start /nonexistent/python3"),
    # profiles
    ("profile not UTF-8", lambda d: (_profile(d, "bad", b'images = "\xfe"\n'), _run(d, "--profile", "bad"))[1], 2,
     "profiles/bad.toml: not UTF-8 text"),
    ("sweep = 5 in a profile", lambda d: (_profile(d, "sw", "sweep = 5\n"),
                                          ["sweep", "--profile", "sw", "--hosts", str(_hosts(d, _host(d)))])[1], 2,
     "profiles/sw.toml: 'sweep' must be a table"),
    ('warmup = "1" in a profile', lambda d: (_profile(d, "str", 'warmup = "1"\n'), _run(d, "--profile", "str"))[1],
     2, "profiles/str.toml: warmup: Input should be a valid integer"),
    ("a local lab6 that allows pickles", lambda d: (_profile(d, "lab6", "allow_pickle = true\n"),
                                                    _run(d, "--profile", "lab6"))[1], 2,
     "profiles/lab6.toml: allow_pickle: a profile cannot set this; give --allow-pickle"),
    ("--profile ../x", lambda d: ((d / "x.toml").write_text("images = 3\n"), _run(d, "--profile", "../x"))[1], 2,
     "--profile: '../x' is not a profile name"),
    ("--profile /abs/path", lambda d: _run(d, "--profile", str(SHIPPED_PROFILES / "quick")), 2,
     "is not a profile name"),
    # flags
    ('--split ","', lambda d: _run(d, "--split", ","), 2, "--split: ',' names no split point"),
    ("--split a,,b", lambda d: _run(d, "--split", "blocks.3,,blocks.6"), 2, "has an empty split point"),
    ('--checkpoint ""', lambda d: _run(d, "--checkpoint", ""), 2, "--checkpoint: String should have at least 1"),
    ("--images 100000", lambda d: _run(d, "--images", "100000"), 2,
     "--images: Input should be less than or equal to 2000"),
    ("--chunk 100000", lambda d: _run(d, "--chunk", "100000"), 2, "--chunk: Input should be less than or equal"),
    ("--repeats 10**6", lambda d: _run(d, "--repeats", "1000000"), 2, "--repeats: Input should be less than"),
    ("--runs-dir that is a file", lambda d: ((d / "f").write_text(""), _run(d, "--runs-dir", str(d / "f")))[1], 2,
     "--runs-dir: "),
    ("PICTL_RUNS_DIR that is a file", lambda d: ((d / "f").write_text(""),
                                                 (_run(d), {"PICTL_RUNS_DIR": str(d / "f")}))[1], 2,
     "the runs directory: "),
    ("PICTL_CONTROLLER with a newline", lambda d: (["stop", "--hosts", str(_hosts(d, _host(d)))],
                                                   {"PICTL_CONTROLLER": "team\n3"}), 2,
     "PICTL_CONTROLLER: at most 128 printable characters"),
    # records and outputs
    ("report --out that is a file", lambda d: ((d / "f").write_text(""), ["report", str(_summary_dir(
        d, json.dumps({"run_id": "x", "status": "ok", "stages": 1, "per_stage": []}))), "--out", str(d / "f")])[1],
     2, "--out: "),
    ("wheels DEST that is a file", lambda d: ((d / "f").write_text(""), ["wheels", str(d / "f")])[1], 2,
     "DEST: "),
    ("a partial summary.json", lambda d: ["report", str(_summary_dir(d, '{"schema": 1, "status": "ok", "run_'))],
     2, "summary.json: not a complete JSON record"),
    ("an empty summary.json", lambda d: ["report", str(_summary_dir(d, "{}"))], 2,
     "summary.json: neither a run's nor a pruning job's summary"),
    ("a summary.json without its figures", lambda d: ["report", str(_summary_dir(d, '{"run_id": "x"}'))], 2,
     "summary.json: not a run summary ('status' is missing"),
    ("a corrupt config.json", lambda d: (_live_run(d, '{"spec": "{'),
                                         ["traces", "--runs-dir", str(d / "elsewhere")])[1], 2,
     "config.json: not a complete JSON record"),
    ("a config.json of another shape", lambda d: (_live_run(d, '{"spec": "[]", "cluster": 5}'),
                                                  ["traces", "--runs-dir", str(d / "elsewhere")])[1], 2,
     "config.json: not a run record this pictl can use"),
]


@pytest.mark.parametrize("what, make, code, fragment", CASES, ids=[c[0] for c in CASES])
def test_refused_in_one_line(what: str, make: Case, code: int, fragment: str, pictl_env, tmp_path: Path) -> None:
    made = make(tmp_path)
    args, env = made if isinstance(made, tuple) else (made, {})
    runs = Path(pictl_env["PICTL_RUNS_DIR"])
    proc = _pictl(args, {**pictl_env, **env}, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pictl: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert fragment in errors[0], errors[0]
    assert not runs.exists() or not any(runs.iterdir()), "a refused run left a run directory"
    assert not list(tmp_path.glob("h0/runs/*")), "a refused run left a run directory on the host"


def test_a_local_profile_that_shadows_a_shipped_one_is_announced(pictl_env, tmp_path: Path) -> None:
    _profile(tmp_path, "lab6", "images = 4\n")
    proc = _pictl(_run(tmp_path, "--profile", "lab6", "--stages", "9"), pictl_env, tmp_path)
    assert proc.returncode == 2  # (9 stages do not fit: nothing runs)
    assert f"pictl: note: profile 'lab6' is {tmp_path}/profiles/lab6.toml, which shadows the shipped one" \
        in proc.stderr


def test_relative_paths_are_resolved_on_the_controller(tmp_path: Path, monkeypatch) -> None:
    from pictl.planning.profiles import resolve_options

    monkeypatch.chdir(tmp_path)
    options = resolve_options(None, {"checkpoint": "ck/x.pth", "data": "cifar10", "data_path": "data"})
    assert options.checkpoint == f"{tmp_path}/ck/x.pth" and options.data_path == f"{tmp_path}/data"
    assert resolve_options(None, {"checkpoint": "~/x.pth"}).checkpoint == "~/x.pth"  # the host's home


@pytest.mark.slow
def test_a_relative_checkpoint_is_the_controllers_file(pictl_env, tmp_path: Path) -> None:
    """`--checkpoint ck/x.pth` that exists here was "no such file" (resolved in the host's run directory);
    now the host reads this very file, and says what is wrong with it (here: it is not a checkpoint)."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "x.pth").write_text("not a checkpoint")
    proc = _pictl(_run(tmp_path, "--checkpoint", "ck/x.pth"), pictl_env, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pictl: error: checkpoint {tmp_path}/ck/x.pth: cannot be read as plain weights"), last
    assert not list(tmp_path.glob("h0/runs/*")) and not Path(pictl_env["PICTL_RUNS_DIR"]).exists()


def test_a_bug_is_one_line_and_exit_1_with_the_traceback_in_a_log(pictl_env, tmp_path: Path) -> None:
    """The entry point's last resort: a command that fails as a bug would (here: one added for the test)."""
    env = {**pictl_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    code = ("import sys\nimport pictl.cli as cli\n"
            "cli.app.command('boom')(lambda: {}['missing'])\n"
            "sys.argv = ['pictl', 'boom']\ncli.entrypoint()\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, text=True, capture_output=True,
                          timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("pictl: error: internal error (a bug in pictl): KeyError: 'missing'; traceback in ")
    log = Path(line.rsplit("traceback in ", 1)[1])
    assert log.is_relative_to(tmp_path) and "KeyError: 'missing'" in log.read_text()
