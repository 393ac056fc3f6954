"""Presets: yours first (your presets directory, then ./profiles, then the shipped ones), where a tune saves its
winner and with which protocol, and the shipped `lab6-stages` on 4 hosts. Nothing here runs a pipeline: what
decides each of these is settled before the first run."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from support.cli import ROOT, run_pictl

from pictl.inventory import load_cluster
from pictl.jobs.sweep import plan_sweep
from pictl.jobs.tune_report import preset_text
from pictl.jobs.tune_space import Candidate
from pictl.jobs.tune_verdicts import Measured
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages, sharing_hosts
from pictl.planning.presets import protocol_of, resolve_options
from pictl.shipped import shipped_path


def _profiles(env: dict[str, str], cwd: Path) -> dict[str, str]:
    proc = run_pictl(["profiles", "--json"], env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: p["path"] for p in json.loads(proc.stdout)}


def test_your_presets_come_first_then_the_working_directorys_then_the_shipped(tmp_path: Path, pictl_env) -> None:
    mine = Path(pictl_env["PICTL_PROFILES_DIR"])
    mine.mkdir()
    (mine / "quick.toml").write_text('description = "my quick"\nimages = 6\n')
    (mine / "both.toml").write_text("images = 7\n")
    project = tmp_path / "project"
    (project / "profiles").mkdir(parents=True)
    (project / "profiles" / "both.toml").write_text("images = 9\n")
    (project / "profiles" / "local.toml").write_text("images = 10\n")
    found = _profiles(pictl_env, project)
    assert found["quick"] == str(mine / "quick.toml") and found["both"] == str(mine / "both.toml")
    assert found["local"] == str(project / "profiles" / "local.toml")
    assert found["lab6"] == str(shipped_path("profiles") / "lab6.toml")
    # In a checkout ./profiles is a link to the shipped presets: yours still come first there.
    assert _profiles(pictl_env, ROOT)["quick"] == str(mine / "quick.toml")
    # A run says which file it took and what it hides (here, with the hosts unreachable, nothing else runs).
    proc = run_pictl(["run", "--profile", "both", "--hosts", str(_dead_inventory(tmp_path / "dead", 2)),
                      "--headless"], pictl_env, cwd=project)
    assert proc.returncode == 4, proc.stderr
    assert f"pictl: note: profile 'both' is {mine / 'both.toml'}, which shadows another " \
           f"({project / 'profiles' / 'both.toml'})" in proc.stderr


def _dead_inventory(path: Path, hosts: int) -> Path:
    """SSH hosts behind a closed port: nothing answers (exit 4 once pictl tries them)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path.mkdir(parents=True, exist_ok=True)
    body = f'[defaults]\ntransport = "ssh"\naddress = "127.0.0.1"\nport = {port}\nuser = "nobody"\n' \
           f'interface = "eth0"\nworkdir = "{path}/w"\n'
    (path / "hosts.toml").write_text(body + "".join(f'[[host]]\nname = "pi{i + 1}"\n' for i in range(hosts)))
    return path / "hosts.toml"


def test_a_sweep_whose_hosts_are_down_is_exit_4_whatever_it_plans(tmp_path: Path, pictl_env) -> None:
    """A balanced sweep plans nothing ahead, so once its hosts were first tried in round 1 and every row read
    "failed" (exit 3); like `pictl run` it is now exit 4 naming the hosts, before its directory is made."""
    dead = _dead_inventory(tmp_path / "dead", 2)
    for policy in ("balanced", "equal"):
        proc = run_pictl(["sweep", "--hosts", str(dead), "--stages", "1,2", "--policy", policy, "--images", "4",
                          "--out", str(tmp_path / policy), "--headless"], pictl_env, timeout=120)
        assert proc.returncode == 4, (policy, proc.stderr[-2000:])
        assert proc.stderr.strip().splitlines()[-1].startswith("pictl: error: host 'pi1' (127.0.0.1:"), proc.stderr
        assert not (tmp_path / policy).exists()


def test_a_tune_from_the_checkout_saves_into_your_presets_directory(tmp_path: Path, pictl_env) -> None:
    """From the repository root (./profiles links into pictl) the tune is no longer refused: its preset goes to
    your presets directory, so it gets as far as the hosts (unreachable here: exit 4, nothing made). Pointed at
    the shipped folder, that directory is refused before anything (exit 2, naming the variable)."""
    dead = _dead_inventory(tmp_path / "dead", 2)
    proc = run_pictl(["tune", "--hosts", str(dead), "--images", "4", "--out", str(tmp_path / "tune")], pictl_env,
                     cwd=ROOT, timeout=120)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("pictl: error: host 'pi1' (127.0.0.1:")
    assert not (tmp_path / "tune").exists() and not Path(pictl_env["PICTL_PROFILES_DIR"], "tuned.toml").exists()
    shipped = {**pictl_env, "PICTL_PROFILES_DIR": str(ROOT / "profiles")}
    proc = run_pictl(["tune", "--hosts", str(dead), "--out", str(tmp_path / "tune")], shipped, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"pictl: error: --save-as tuned: {ROOT / 'profiles'} is pictl's shipped presets folder "
        f"({shipped_path('profiles')}); a tuned preset goes in a profiles folder of your own: set "
        "PICTL_PROFILES_DIR to another"]
    proc = run_pictl(["tune", "--hosts", str(dead), "--save-as", "quick"], pictl_env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"pictl: error: --save-as quick: 'quick' is a shipped preset, and {pictl_env['PICTL_PROFILES_DIR']}/"
        "quick.toml would shadow it for every --profile quick run; give --force to save it anyway, or another name")


def test_a_tuned_preset_keeps_the_users_protocol_not_the_tunes(tmp_path: Path) -> None:
    """The issue's tune (`--profile quick --images 8 --repeats 1`): the saved winner runs quick's 24 images, 1
    warm-up and 2 passes, its configuration what won; a protocol the winner cannot run keeps the measured one."""
    tune_base = resolve_options("quick", {"images": 8, "repeats": 1})
    won = Measured(Candidate(1, 3), throughput_ips=8.3, split_points=["blocks.4", "blocks.8"])
    path = tmp_path / "tuned.toml"
    path.write_text(preset_text(won.candidate.options(tune_base), won, "hosts.toml", protocol_of("quick")))
    again = resolve_options("tuned", {}, extra=tmp_path)
    assert (again.images, again.warmup, again.repeats) == (24, 1, 2)
    assert (again.stages, again.split, again.policy) == (3, ["blocks.4", "blocks.8"], "explicit")
    assert protocol_of(None) == {k: getattr(RunOptions(), k) for k in ("images", "warmup", "repeats")}
    # 8 replicas deal 8 microbatches evenly, not lab6's 500: the tune's 8 images are kept, and the file says why.
    replicas = Measured(Candidate(8, 1), throughput_ips=12.0)
    text = preset_text(replicas.candidate.options(tune_base), replicas, "hosts.toml", protocol_of("lab6"))
    path.write_text(text)
    assert resolve_options("tuned", {}, extra=tmp_path).images == 8
    assert "# 500 images do not deal evenly over 8 replicas" in text


def test_lab6_stages_runs_on_four_hosts(tmp_path: Path, pictl_env) -> None:
    """The course's stage comparison on 4 hosts with one slot each (the shipped cluster, 4 Pis): its 6 stages ask
    for 2 slots, as the preset says, instead of refusing the sweep (exit 2)."""
    cluster = load_cluster(shipped_path("hosts.toml"))
    _, points = plan_sweep(cluster, "lab6-stages", {}, stages=None, chunks=None, policies=None)
    assert [(p.stages, p.policy) for p in points] == [(1, "serial")] + [
        (s, p) for s in (2, 3, 4, 6) for p in ("equal", "balanced")]
    six = [p for p in points if p.stages == 6]
    assert all(p.slots == 2 for p in six) and all(p.slots is None for p in points if p.stages <= 4)
    placed = place_stages(sharing_hosts(cluster, 6, 2), 6)
    assert [(n.host.name, len(n.ranks)) for n in placed] == [("local0", 2), ("local1", 2), ("local2", 1),
                                                            ("local3", 1)]
    # Through the CLI, on 4 Pis: past the planning, to the hosts (unreachable here: exit 4, not 2).
    proc = run_pictl(["sweep", "--profile", "lab6-stages", "--hosts", str(_dead_inventory(tmp_path / "pis", 4)),
                      "--out", str(tmp_path / "sweep"), "--headless"], pictl_env, timeout=120)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "do not fit" not in proc.stderr
    # On 2 hosts even 2 slots each are too few for 6 stages: refused before anything runs, naming the value.
    proc = run_pictl(["sweep", "--profile", "lab6-stages", "--hosts", str(_dead_inventory(tmp_path / "two", 2)),
                      "--out", str(tmp_path / "sweep2")], pictl_env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "pictl: error: sweep value stages=6 chunk=1 policy=equal wire=fp32: 6 stages do not fit")
    # The Python API keeps the same promise: the preset's [sweep] table, slots included, then the hosts (exit 4).
    import pictl
    from pictl import errors as E

    with pytest.raises(E.PictlError) as unreachable:
        pictl.sweep(load_cluster(_dead_inventory(tmp_path / "api", 4)), profile="lab6-stages", out=tmp_path / "s3",
                    runs_dir=tmp_path / "runs")
    assert unreachable.value.exit_code == 4, unreachable.value
    with pytest.raises(E.ConfigError, match="stages=6 chunk=1 policy=equal wire=fp32: 6 stages do not fit"):
        pictl.sweep(load_cluster(_dead_inventory(tmp_path / "api2", 2)), profile="lab6-stages", out=tmp_path / "s4",
                    runs_dir=tmp_path / "runs")
