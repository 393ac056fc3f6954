"""hosts.toml and profiles: typed, validated, errors that name the file and the field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pictl.cluster.commands import worker_env
from pictl.cluster.ranks import torchrun_argv
from pictl.errors import ConfigError
from pictl.inventory import load_cluster
from pictl.planning.placement import place_stages
from pictl.planning.presets import available_presets, resolve_options

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "support" / "data" / "bad_hosts"


def test_shipped_inventory_is_a_local_cluster_of_four() -> None:
    cluster = load_cluster(ROOT / "hosts.toml")
    assert [h.name for h in cluster.hosts] == ["local0", "local1", "local2", "local3"]
    assert {h.transport for h in cluster.hosts} == {"local"}
    assert len({h.workdir for h in cluster.hosts}) == 4


def test_readme_pi_example_parses(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pis.toml").write_text(example)
    cluster = load_cluster(tmp_path / "pis.toml")
    assert len(cluster.hosts) == 4
    pi = cluster.hosts[2]
    assert pi.transport == "ssh" and pi.interface == "eth0" and pi.lan_address
    assert pi.python_path().endswith("/bin/python")


@pytest.mark.parametrize("name, fragment", [
    ("malformed.toml", "not valid TOML"),
    ("bad_port.toml", "host[1].port"),
    ("unknown_field.toml", "host[0].adress"),
    ("duplicate_name.toml", "'pi1' is used twice"),
    ("no_hosts.toml", "no [[host]] entries"),
    ("bad_transport.toml", "host[0].transport"),
])
def test_bad_inventory_names_file_and_field(name: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster(BAD / name)
    message = str(info.value)
    assert message.startswith(str(BAD / name)), message
    assert fragment in message
    assert "\n" not in message


def test_missing_inventory() -> None:
    with pytest.raises(ConfigError, match="inventory file not found"):
        load_cluster(BAD / "nope.toml")


def test_profiles_ship_quick_and_lab6() -> None:
    assert {"quick", "lab6"} <= set(available_presets())
    lab = resolve_options("lab6", {})
    assert (lab.images, lab.chunk, lab.warmup, lab.repeats, lab.threads) == (500, 1, 1, 5, 4)


def test_flags_override_profile_and_split_implies_explicit() -> None:
    opts = resolve_options("lab6", {"images": 10, "split": ["blocks.3"], "stages": 2, "chunk": None})
    assert opts.images == 10 and opts.chunk == 1 and opts.policy == "explicit"


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown profile 'nope' \(available: .*lab6.*quick"):
        resolve_options("nope", {})


@pytest.mark.parametrize("overrides, fragment", [
    ({"stages": 0}, "stages"), ({"chunk": 0}, "chunk"), ({"data": "cifar10"}, "needs data_path"),
    ({"policy": "random"}, "policy"),
])
def test_bad_run_options(overrides: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        resolve_options(None, overrides)


def test_placement_and_torchrun_lines() -> None:
    cluster = load_cluster(ROOT / "hosts.toml")
    nodes = place_stages(cluster, 3)
    assert [(n.host.name, n.node_rank, list(n.ranks)) for n in nodes] == [
        ("local0", 0, [0]), ("local1", 1, [1]), ("local2", 2, [2])]
    argv = torchrun_argv(nodes[1], nnodes=3, master=nodes[0].host, master_port=29555, spec_path="spec.json",
                         run_id="20261123-1-s3-ab12")
    # warm (the default): torchrun's agent and each rank are forked from the host's warm process
    assert argv[1:4] == ["-m", "remote.host.warmclient", "torch.distributed.run"]
    assert argv[-5:] == ["-m", "remote.host.warmclient", "remote.runtime.pipeline", "--spec", "spec.json"]
    cold = torchrun_argv(replace(nodes[1], host=nodes[1].host.model_copy(update={"warm": False})), nnodes=3,
                         master=nodes[0].host, master_port=29555, spec_path="spec.json")
    assert cold[1:3] == ["-m", "torch.distributed.run"] and cold[-4:] == ["-m", "remote.runtime.pipeline", "--spec",
                                                                          "spec.json"]
    assert {"--nnodes=3", "--nproc-per-node=1", "--node-rank=1", "--rdzv-backend=static",
            "--rdzv-id=20261123-1-s3-ab12", "--master-addr=127.0.0.1", "--master-port=29555"} <= set(argv)
    env = worker_env(nodes[1].host, threads=4)
    assert env["OMP_NUM_THREADS"] == "4" and env["GLOO_SOCKET_IFNAME"] == "lo"
    with pytest.raises(ConfigError, match="5 stages do not fit"):
        place_stages(cluster, 5)



def _ranked(tmp_path: Path, ranks: list[int | None]) -> Path:
    inv = tmp_path / "hosts.toml"
    body = ['[defaults]\ntransport = "local"\n']
    for name, rank in zip("abc", ranks, strict=False):
        body.append(f'[[host]]\nname = "{name}"\n' + (f"rank = {rank}\n" if rank is not None else ""))
    inv.write_text("\n".join(body))
    return inv


def test_explicit_ranks_order_the_hosts(tmp_path: Path) -> None:
    assert [h.name for h in load_cluster(_ranked(tmp_path, [2, 0, 1])).hosts] == ["b", "c", "a"]


@pytest.mark.parametrize(("ranks", "fragment"), [
    ([2, 0, 2], "host[2].rank: 2 is used twice"),
    ([2, 0, 7], "host[2].rank: 7 is out of range (0..2)"),
    ([0, None], "host[1].rank: missing (give every host a rank, or none)"),
])
def test_bad_ranks_are_named(tmp_path: Path, ranks: list, fragment: str) -> None:
    inv = _ranked(tmp_path, ranks)
    with pytest.raises(ConfigError) as info:
        load_cluster(inv)
    assert str(info.value) == f"{inv}: {fragment}"


def test_sweep_presets_reproduce_the_course_tables(tmp_path: Path, monkeypatch) -> None:
    from pictl.planning.presets import sweep_settings

    stages = sweep_settings("lab6-stages")
    assert stages.stages == [1, 2, 3, 4, 6] and stages.policy == ["equal", "balanced"]
    assert resolve_options("lab6-stages", {}).images == 500  # the run options ignore [sweep]
    assert sweep_settings("chunk-tradeoff").chunks == [1, 2, 4, 8]
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_text('[sweep]\nstages = [1, 2]\npolicy = ["greedy"]\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError,
                       match=r"mine.toml: sweep: policy\[0\]: must be 'equal' or 'balanced' \(got 'greedy'\)"):
        sweep_settings("mine")


@pytest.mark.parametrize(("name", "model", "stages", "sweep"), [
    ("resnet50", "resnet50", 4, [1, 2, 3, 4]), ("mobilenetv2", "mobilenetv2_100", 4, [1, 2, 4]),
    ("vgg16", "vgg16", 3, [1, 3]),
])
def test_the_published_cnn_set_ups_are_presets(name: str, model: str, stages: int, sweep: list[int]) -> None:
    """The set-ups the CNN papers on Pi clusters report, ready to run and to sweep (equal against balanced)."""
    from pictl.planning.presets import sweep_settings

    options = resolve_options(name, {})
    assert (options.model, options.stages, options.policy, options.threads) == (model, stages, "balanced", 0)
    settings = sweep_settings(name)
    assert settings.stages == sweep and settings.policy == ["equal", "balanced"]


def test_pictl_profiles_shows_a_presets_words_as_written() -> None:
    from typer.testing import CliRunner

    from pictl.cli import app

    shown = CliRunner().invoke(app, ["profiles"], env={"COLUMNS": "300", "FORCE_COLOR": None})
    assert shown.exit_code == 0 and "lab6's settings, and [rules] a run" in shown.stdout, shown.stdout
