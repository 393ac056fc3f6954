"""Hostile and careless inputs through the real CLI: one `pictl: error:` line naming the file, field, flag
or host, the README's exit code, no traceback, and nothing started or left behind."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import ROOT
from support.forked import PictlServer

from pictl.planning.presets import SHIPPED_PRESETS

LOCAL = '[defaults]\ntransport = "local"\ninterface = "lo"\n'


def _pictl(forks: PictlServer, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`pictl ARGS` as a process of its own (`pictl_forks`: forked from one that imported pictl once)."""
    return forks.run(args, env, 120, cwd=cwd)


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


def _prune(d: Path, *args: str) -> list[str]:
    return ["prune", "--data", "imagefolder", "--data-path", str(d), *args]


def _train(d: Path, *args: str) -> list[str]:
    return ["train", "--hosts", str(_hosts(d, _host(d))), "--out", str(d / "trains"), *args]


def _init(*args: str) -> list[str]:
    return ["init", "--no-trust", "--no-check", *args]


def _init_local(out: Path | str, *args: str) -> list[str]:
    return _init("--transport", "local", "--count", "1", "--out", str(out), *args)


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "fifo")
    return d / "fifo"


def _link(d: Path) -> Path:
    (d / "real.toml").write_text("# mine\n")
    (d / "link.toml").symlink_to(d / "real.toml")
    return d / "link.toml"


NESTED = "[" * 5000 + "]" * 5000
"""A JSON value 5000 lists deep: json's parser recurses once per level (RecursionError at about 1000)."""
LONG_NAME = "n" * 300
"""A file name over NAME_MAX (255 bytes): every call that looks it up fails with ENAMETOOLONG."""


def _long_path(d: Path) -> str:
    """A path over PATH_MAX (4096 bytes), of short names."""
    return str(d) + "/d" * 2100 + "/x.toml"


PYDANTIC_WORDS = re.compile(r"Input should|String should|List should|validation errors? for|Value error|Extra inputs|"
                            r"Field required|errors\.pydantic|type=|input_value")
"""pydantic's own phrasing: a user never sees it (`pictl.validation` says every problem in pictl's words)."""
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
     "i.toml: host[0].port: must be a whole number (got '22')"),
    ("slots = true", lambda d: _run(d, "--hosts", str(_hosts(d, _host(d, "slots = true\n"), "i.toml"))), 2,
     "i.toml: host[0].slots: must be a whole number (got True)"),
    ('interface = "../../.."', lambda d: _run(d, "--hosts", str(_hosts(d, _host(d, 'interface = "../../.."\n'),
                                                                       "i.toml"))), 2,
     "i.toml: host[0].interface: must match "),
    ("cluster.name = 5", lambda d: ["hosts", "--hosts", str(_hosts(d, 'cluster = {name = 5}\n[[host]]\nname = "a"\n'))],
     2, "hosts.toml: cluster.name: must be a string"),
    ("--hosts that is a directory", lambda d: ["hosts", "--hosts", str(d)], 2, "inventory file not found"),
    ("--runs-dir ''", lambda d: _run(d, "--runs-dir", ""), 2,
     "Invalid value for '--runs-dir': empty path (see `pictl run -h`)"),
    ("--runs-dir a symlink loop", lambda d: (os.symlink(d / "b", d / "a"), os.symlink(d / "a", d / "b"),
                                             _run(d, "--runs-dir", str(d / "a" / "runs")))[2], 2,
     "is a symbolic link loop"),
    ("--runs-dir name over 255 bytes", lambda d: _run(d, "--runs-dir", str(d / ("r" * 300))), 2,
     "File name too long"),
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
     2, "profiles/str.toml: warmup: must be a whole number (got '1')"),
    ("a local lab6 that allows pickles", lambda d: (_profile(d, "lab6", "allow_pickle = true\n"),
                                                    _run(d, "--profile", "lab6"))[1], 2,
     "profiles/lab6.toml: allow_pickle: a profile cannot set this; give --allow-pickle"),
    ("--profile ../x", lambda d: ((d / "x.toml").write_text("images = 3\n"), _run(d, "--profile", "../x"))[1], 2,
     "--profile: '../x' is not a profile name"),
    ("--profile /abs/path", lambda d: _run(d, "--profile", str(SHIPPED_PRESETS / "quick")), 2,
     "is not a profile name"),
    # flags
    ('--split ","', lambda d: _run(d, "--split", ","), 2, "--split: ',' names no split point"),
    ("--split a,,b", lambda d: _run(d, "--split", "blocks.3,,blocks.6"), 2, "has an empty split point"),
    ('--checkpoint ""', lambda d: _run(d, "--checkpoint", ""), 2, "--checkpoint: must not be empty"),
    ("--images 100000", lambda d: _run(d, "--images", "100000"), 2,
     "--images: must be between 1 and 2000 (got 100000)"),
    ("--chunk 100000", lambda d: _run(d, "--chunk", "100000"), 2, "--chunk: must be between 1 and 256 (got 100000)"),
    ("--repeats 10**6", lambda d: _run(d, "--repeats", "1000000"), 2,
     "--repeats: must be between 1 and 1000 (got 1000000)"),
    ("--runs-dir that is a file", lambda d: ((d / "f").write_text(""), _run(d, "--runs-dir", str(d / "f")))[1], 2,
     "--runs-dir: "),
    ("PICTL_RUNS_DIR that is a file", lambda d: ((d / "f").write_text(""),
                                                 (_run(d), {"PICTL_RUNS_DIR": str(d / "f")}))[1], 2,
     "the runs directory: "),
    # a runs directory that cannot be made (root passes every permission check; /proc still refuses it):
    # refused before the code is pushed, not exit 9 after it
    ("--runs-dir under /proc", lambda d: _run(d, "--runs-dir", "/proc/pictl-no/runs"), 2,
     "--runs-dir: /proc"),
    ("PICTL_RUNS_DIR under /proc", lambda d: (_run(d), {"PICTL_RUNS_DIR": "/proc/pictl-no/runs"}), 2,
     "the runs directory: /proc"),
    ("sweep --out under /proc", lambda d: ["sweep", "--hosts", str(_hosts(d, _host(d))), "--stages", "1",
                                           "--out", "/proc/pictl-no/sweep"], 2, "--out: /proc"),
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
    # prune's bounds are train's (a typo of 10**9 epochs, or inf, is refused before anything starts)
    ("prune --lr inf", lambda d: _prune(d, "--lr", "inf"), 2, "--lr: must be a finite number (got inf)"),
    ("prune --lr nan", lambda d: _prune(d, "--lr", "nan"), 2, "--lr: must be a finite number (got nan)"),
    ("prune --lr 100", lambda d: _prune(d, "--lr", "100"), 2, "--lr: must be more than 0 and at most 10 (got 100.0)"),
    ("prune --epochs 10**9", lambda d: _prune(d, "--epochs", str(10**9)), 2,
     "--epochs: must be between 0 and 10000 (got 1000000000)"),
    ("prune --num-classes 10**12", lambda d: _prune(d, "--num-classes", str(10**12)), 2,
     "--num-classes: must be between 0 and 100000"),
    ("prune --round-to 10**9", lambda d: _prune(d, "--round-to", str(10**9)), 2,
     "--round-to: must be between 1 and 1024"),
    ("prune --batch-size 10**6", lambda d: _prune(d, "--batch-size", str(10**6)), 2,
     "--batch-size: must be between 1 and 4096"),
    ("prune --calib-batches 10**9", lambda d: _prune(d, "--calib-batches", str(10**9)), 2,
     "--calib-batches: must be between 1 and 10000"),
    ("prune --train-images 10**12", lambda d: _prune(d, "--train-images", str(10**12)), 2,
     "--train-images: must be between 0 and 10000000"),
    ("prune --threads 10**6", lambda d: _prune(d, "--threads", str(10**6)), 2,
     "--threads: must be between 0 and 256"),
    ("prune --seed -1", lambda d: _prune(d, "--seed", "-1"), 2, "--seed: must be between 0 and 2147483647 (got -1)"),
    ("prune --model ''", lambda d: _prune(d, "--model", ""), 2, "--model: must not be empty"),
    ("prune --checkpoint a name over 255 bytes", lambda d: _prune(d, "--checkpoint", str(d / LONG_NAME)), 2,
     ": File name too long"),
    ("train --lr inf", lambda d: _train(d, "--lr", "inf"), 2, "--lr: must be a finite number (got inf)"),
    # --model-arg: JSON where it parses, bounded before json's parser can recurse out of the stack
    ("prune --model-arg 5000 deep", lambda d: _prune(d, "--model-arg", f"depth={NESTED}"), 2,
     "--model-arg depth: the value has 10000 characters (at most 1024)"),
    ("train --model-arg 5000 deep", lambda d: _train(d, "--model-arg", f"depth={NESTED}"), 2,
     "--model-arg depth: the value has 10000 characters (at most 1024)"),
    ("sweep --train --model-arg 5000 deep", lambda d: ["sweep", "--train", "--model-arg", f"depth={NESTED}"], 2,
     "--model-arg depth: the value has 10000 characters"),
    ("train --model-arg 9 deep", lambda d: _train(d, "--model-arg", "x=" + "[" * 9 + "]" * 9), 2,
     "--model-arg x: the value nests more than 8 deep"),
    ("prune --model-arg 9 deep in objects", lambda d: _prune(d, "--model-arg", "x=" + '{"a":' * 9 + "1" + "}" * 9),
     2, "--model-arg x: the value nests more than 8 deep"),
    ("train --model-arg with a key that is no name", lambda d: _train(d, "--model-arg", "a b=1"), 2,
     "--model-arg 'a b=1': use KEY=VALUE"),
    # numbers in specs: ASCII digits only (int(), str.isdigit() and \d also take other scripts' digits)
    ("--wire lowrank:٣ (Arabic-Indic 3)", lambda d: _run(d, "--wire", "lowrank:\u0663"), 2,
     "--wire: 'lowrank:\u0663' is not a wire format"),
    ("--wire lowrank:１２ (fullwidth 12)", lambda d: _run(d, "--wire", "lowrank:\uff11\uff12"), 2,
     "--wire: 'lowrank:\uff11\uff12' is not a wire format"),
    ("--wire lowrank:² (superscript 2)", lambda d: _run(d, "--wire", "lowrank:\u00b2"), 2, "is not a wire format"),
    ("--wire with a cut named in another script's digits", lambda d: _run(
        d, "--stages", "2", "--split", "blocks.3", "--wire", "blocks.\u0663=fp16"), 2,
     "--wire: 'blocks.\u0663' is not a module name"),
    ("sweep --wire lowrank:١", lambda d: ["sweep", "--hosts", str(_hosts(d, _host(d))), "--wire", "lowrank:\u0661"], 2,
     "--wire: 'lowrank:\u0661' is not a wire format"),
    ("init --address with a fullwidth port", lambda d: _init("--address", "pi@h1:\uff12\uff12",
                                                            "--out", str(d / "o.toml")), 2,
     "the port '\uff12\uff12' is not a number"),
    # init: addresses pictl (and ssh) would take as something else, and names no resolver takes
    ("init --address a,* (a known_hosts pattern)", lambda d: _init("--address", "a,*", "--out", str(d / "o.toml")),
     2, "--address 'a,*': 'a,*' is not a host name"),
    ("init --address of 5000 characters", lambda d: _init("--address", "a" * 5000, "--out", str(d / "o.toml")), 2,
     "a host name of 5000 characters (at most 253)"),
    ("init --address with a 64-character label", lambda d: _init("--address", "x" * 64 + ".lan",
                                                                "--out", str(d / "o.toml")), 2,
     "is not a host name"),
    ("init --address=-oProxyCommand=x", lambda d: _init("--address=-oProxyCommand=x", "--out", str(d / "o.toml")), 2,
     "'-oProxyCommand=x' is not a host name"),
    ("init --address 1.2.3", lambda d: _init("--address", "1.2.3", "--out", str(d / "o.toml")), 2,
     "'1.2.3' is not an IPv4 address"),
    ("init --address with an IPv6 zone that is a pattern", lambda d: _init("--address", "fe80::1%a,*",
                                                                          "--out", str(d / "o.toml")), 2,
     "'a,*' is not an interface name"),
    ("init --address with a user of spaces", lambda d: _init("--address", "p i@h1", "--out", str(d / "o.toml")), 2,
     "'p i' is not a user name"),
    ("init --address with port 0", lambda d: _init("--address", "h1:0", "--out", str(d / "o.toml")), 2,
     "port 0 is not in 1..65535"),
    ("init --user=-oX", lambda d: _init("--address", "h1", "--user=-oX", "--out", str(d / "o.toml")), 2,
     "--user: '-oX' is not a user name"),
    ("init --name ''", lambda d: _init_local(d / "o.toml", "--name", ""), 2, "--name: '' is not a cluster name"),
    ("init --names with a space", lambda d: _init_local(d / "o.toml", "--names", "a b"), 2,
     "o.toml: host[0].name: must match "),
    ("an inventory whose address is a pattern", lambda d: ["hosts", "--hosts", str(_hosts(
        d, '[[host]]\nname = "a"\naddress = "pi*"\n', "i.toml"))], 2, "i.toml: host[0].address: 'pi*' is not a host"),
    ("an inventory whose lan_address has a space", lambda d: ["hosts", "--hosts", str(_hosts(
        d, '[[host]]\nname = "a"\nlan_address = "10.0.0.1 x"\n', "i.toml"))], 2,
     "i.toml: host[0].lan_address: '10.0.0.1 x' is not a host name"),
    # init --out: only a new path or a regular file, written whole or not at all
    ("init --out a directory", lambda d: _init_local(d, "--force"), 2, "not a regular file"),
    ("init --out a fifo", lambda d: _init_local(_fifo(d), "--force"), 2,
     "fifo: not a regular file; give a new path or a regular file"),
    ("init --out a symbolic link", lambda d: _init_local(_link(d), "--force"), 2, "link.toml: a symbolic link"),
    ("init --out a name over 255 bytes", lambda d: _init_local(d / LONG_NAME), 2,
     "cannot write it (File name too long)"),
    ("init --out a path over 4096 bytes", lambda d: _init_local(_long_path(d)), 2,
     "cannot write it (File name too long)"),
    ("init --out in a folder that does not exist", lambda d: _init_local(d / "no" / "h.toml"), 2,
     "its folder"),
    ("init --out under a file", lambda d: ((d / "f").write_text(""), _init_local(d / "f" / "h.toml"))[1], 2,
     "cannot write it (Not a directory)"),
    ("init --out ~nosuchuser/h.toml", lambda d: _init_local("~pictl-no-such-user/h.toml"), 2,
     "no such user's home folder"),
    ("--hosts a name over 255 bytes", lambda d: ["hosts", "--hosts", str(d / LONG_NAME)], 2,
     "cannot read the inventory file (File name too long)"),
    ("run --hosts a path over 4096 bytes", lambda d: ["run", "--headless", "--hosts", _long_path(d)], 2,
     "cannot read the inventory file (File name too long)"),
    ("sweep --out a name over 255 bytes", lambda d: ["sweep", "--hosts", str(_hosts(d, _host(d))), "--stages", "1",
                                                     "--out", str(d / LONG_NAME)], 2, "File name too long"),
    # an empty profile name is a mistake to name, not "no profile"
    ("run --profile ''", lambda d: _run(d, "--profile", ""), 2, "--profile: '' is not a profile name"),
    ("sweep --profile ''", lambda d: ["sweep", "--profile", "", "--hosts", str(_hosts(d, _host(d)))], 2,
     "--profile: '' is not a profile name"),
    ("sweep --train --profile (ignored before)", lambda d: ["sweep", "--train", "--profile", "quick"], 2,
     "--profile: a training sweep (--train) takes no profile"),
]


@pytest.mark.parametrize("what, make, code, fragment", CASES, ids=[c[0] for c in CASES])
def test_refused_in_one_line(what: str, make: Case, code: int, fragment: str, pictl_forks, pictl_env,
                             tmp_path: Path) -> None:
    made = make(tmp_path)
    args, env = made if isinstance(made, tuple) else (made, {})
    runs = Path(pictl_env["PICTL_RUNS_DIR"])
    proc = _pictl(pictl_forks, args, {**pictl_env, **env}, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pictl: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert fragment in errors[0], errors[0]
    assert not PYDANTIC_WORDS.search(proc.stderr), proc.stderr  # said in pictl's words, never pydantic's
    assert not runs.exists() or not any(runs.iterdir()), "a refused run left a run directory"
    assert not list(tmp_path.glob("h0/runs/*")), "a refused run left a run directory on the host"
    if code == 2:  # bad input is refused before a host is touched (a host that is not ready, 6, was asked)
        assert not (tmp_path / "h0").exists(), "bad input was refused after the code was pushed or a lease taken"
    assert not list(tmp_path.rglob(".pictl-init-*")), "a refused init left its temporary file"


def test_a_local_profile_that_shadows_a_shipped_one_is_announced(pictl_forks, pictl_env, tmp_path: Path) -> None:
    _profile(tmp_path, "lab6", "images = 4\n")
    proc = _pictl(pictl_forks, _run(tmp_path, "--profile", "lab6", "--stages", "9"), pictl_env, tmp_path)
    assert proc.returncode == 2  # (9 stages do not fit: nothing runs)
    assert f"pictl: note: profile 'lab6' is {tmp_path}/profiles/lab6.toml, which shadows the shipped one" \
        in proc.stderr


def test_relative_paths_are_resolved_on_the_controller(tmp_path: Path, monkeypatch) -> None:
    from pictl.planning.presets import resolve_options

    monkeypatch.chdir(tmp_path)
    options = resolve_options(None, {"checkpoint": "ck/x.pth", "data": "cifar10", "data_path": "data"})
    assert options.checkpoint == f"{tmp_path}/ck/x.pth" and options.data_path == f"{tmp_path}/data"
    assert resolve_options(None, {"checkpoint": "~/x.pth"}).checkpoint == "~/x.pth"  # the host's home


@pytest.mark.slow
def test_a_relative_checkpoint_is_the_controllers_file(pictl_forks, pictl_env, tmp_path: Path) -> None:
    """`--checkpoint ck/x.pth` that exists here was "no such file" (resolved in the host's run directory);
    now the host reads this very file, and says what is wrong with it (here: it is not a checkpoint)."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "x.pth").write_text("not a checkpoint")
    proc = _pictl(pictl_forks, _run(tmp_path, "--checkpoint", "ck/x.pth"), pictl_env, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pictl: error: checkpoint {tmp_path}/ck/x.pth: cannot be read as plain weights"), last
    assert not list(tmp_path.glob("h0/runs/*")) and not Path(pictl_env["PICTL_RUNS_DIR"]).exists()


_BUG = ("import sys\nimport pictl.cli as cli\n"
        "cli.app.command('boom')(lambda: {}['missing'])\n"
        "sys.argv = ['pictl', 'boom']\ncli.entrypoint()\n")


def test_a_bug_is_one_line_and_exit_1_with_the_traceback_in_a_log(pictl_forks, pictl_env, tmp_path: Path) -> None:
    """The entry point's last resort: a command that fails as a bug would (here: one added for the test)."""
    env = {**pictl_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = pictl_forks.run([], env, 60, cwd=ROOT, code=_BUG)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("pictl: error: internal error (a bug in pictl): KeyError: 'missing'; traceback in ")
    log = Path(line.rsplit("traceback in ", 1)[1])
    assert log.is_relative_to(tmp_path) and "KeyError: 'missing'" in log.read_text()


def _one_error(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pictl: error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("tty", ["neither", "stdin", "stdout"])
def test_the_dashboard_without_a_terminal_is_refused_at_once(tty: str, pictl_env, tmp_path: Path) -> None:
    """Plain `pictl` in a pipe wrote full-screen escape codes into it and waited for a key forever."""
    import pty

    main, side = pty.openpty()
    try:
        stdin: dict[str, Any] = {"stdin": side} if tty == "stdin" else {"input": ""}  # a terminal, or a pipe
        proc = subprocess.run([sys.executable, "-m", "pictl", "--hosts", str(_hosts(tmp_path, _host(tmp_path)))],
                              env=pictl_env, cwd=tmp_path, text=True, timeout=20, **stdin,
                              stdout=side if tty == "stdout" else subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(main)
        os.close(side)
    missing = {"neither": "stdin and stdout are not one", "stdin": "stdout is not one", "stdout": "stdin is not one"}
    line = _one_error(proc, 2, f"the dashboard needs a terminal ({missing[tty]}); use `pictl run --headless`")
    assert line == (f"pictl: error: the dashboard needs a terminal ({missing[tty]}); use `pictl run --headless` "
                    f"in scripts")
    assert tty == "stdout" or proc.stdout == "", "the dashboard wrote to a pipe"


@pytest.mark.parametrize("value, shows", [("0", False), ("false", False), ("no", False), ("", False), ("off", False),
                                          ("1", True), ("true", True), ("YES", True), (" True ", True)])
def test_pictl_debug_is_on_only_when_it_says_so(value: str, shows: bool, pictl_forks, pictl_env,
                                               tmp_path: Path) -> None:
    """PICTL_DEBUG=0 turned debugging on (any non-empty string did): only 1, true and yes do."""
    env = {**pictl_env, "XDG_STATE_HOME": str(tmp_path / "state"), "PICTL_DEBUG": value}
    proc = pictl_forks.run([], env, 60, cwd=ROOT, code=_BUG)
    assert proc.returncode == 1
    if shows:
        assert "Traceback" in proc.stderr and "KeyError: 'missing'" in proc.stderr
    else:
        _one_error(proc, 1, "internal error (a bug in pictl): KeyError: 'missing'; traceback in ")


def _needs_root(what: str) -> None:
    from support.clusters import skip_loudly

    if os.geteuid() != 0:
        skip_loudly(f"NEEDS ROOT: {what}")


def test_init_never_replaces_a_device_even_as_root(pictl_forks, pictl_env, tmp_path: Path) -> None:
    """As root, `--out /dev/full --force` renamed a regular file over the device node."""
    _needs_root("only root can replace /dev/full, which is what this guards against")
    before = os.stat("/dev/full")
    assert stat.S_ISCHR(before.st_mode)
    proc = _pictl(pictl_forks, _init_local("/dev/full", "--force"), pictl_env, tmp_path)
    _one_error(proc, 2, "--out /dev/full: not a regular file; give a new path or a regular file")
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev, "/dev/full is no longer the device"
    assert not list(Path("/dev").glob(".pictl-init-*"))


def test_init_on_a_read_only_mount_is_one_line(pictl_forks, pictl_env, tmp_path: Path) -> None:
    """A read-only folder was an internal error (exit 1); now it is bad input naming the path (exit 2)."""
    _needs_root("mounting a read-only tmpfs")
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(ro)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        from support.clusters import skip_loudly

        skip_loudly(f"CANNOT MOUNT A TMPFS HERE: {mounted.stderr.strip()}")
    try:
        for extra in ([], ["--force"]):
            proc = _pictl(pictl_forks, _init_local(ro / "hosts.toml", *extra), pictl_env, tmp_path)
            _one_error(proc, 2, f"--out {ro}/hosts.toml: cannot write it (Read-only file system)")
        assert not list(ro.iterdir())
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_init_takes_what_ssh_takes_and_replaces_a_file_whole(pictl_forks, pictl_env, tmp_path: Path) -> None:
    """What the checks must not refuse: names, ~/.ssh/config aliases, IPv4, IPv6 (bracketed with a port, bare,
    with a zone), a fully qualified name; and `--force` over a regular file gives a regular file."""
    out = tmp_path / "pis.toml"
    out.write_text("# old\n")
    addresses = ["pi@10.0.0.5:2222", "[fe80::1]:22", "fe80::2%eth0", "lab_h1", "pi-4.local.", "my.pi:65535"]
    proc = _pictl(pictl_forks, _init("--force", "--out", str(out), *sum((["--address", a] for a in addresses), [])),
                  pictl_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    from pictl.inventory import load_cluster

    hosts = load_cluster(out).hosts
    assert [(h.user, h.address, h.port) for h in hosts] == [
        ("pi", "10.0.0.5", 2222), (None, "fe80::1", 22), (None, "fe80::2%eth0", None), (None, "lab_h1", None),
        (None, "pi-4.local.", None), (None, "my.pi", 65535)]
    assert stat.S_ISREG(os.lstat(out).st_mode) and not list(tmp_path.glob(".pictl-init-*"))
