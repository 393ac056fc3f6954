"""Every bad input: one clear line naming what is wrong, exit 2, nothing started or left behind."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.cli import ROOT, run_pictl
from support.clusters import write_cluster

from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.spec import DataSpec, RunSpec
from remote.runtime.plan import emit_plan
from remote.toolkit.model import create_meta_model, materialize

BAD = ROOT / "tests" / "support" / "data" / "bad_hosts"


@pytest.fixture
def hosts(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "cluster", 4)


def _refused(args: list[str], env: dict[str, str], fragment: str, tmp_path: Path) -> None:
    proc = run_pictl(["run", "--headless", "--json", "--images", "2", "--policy", "equal", *args], env)
    errors = [line for line in proc.stderr.strip().splitlines() if "error" in line.lower()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    # Progress lines may come first; the error is one line, the last one.
    assert len(errors) == 1 and errors[0].startswith("pictl: error: "), proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert fragment in errors[0], errors[0]
    assert proc.stdout == ""
    runs = Path(env["PICTL_RUNS_DIR"])
    assert not runs.exists() or not any(runs.iterdir()), "a refused run left a run directory"
    leftovers = list((tmp_path / "cluster").glob("h*/runs/*"))
    assert not leftovers, f"a refused run left {leftovers}"


@pytest.mark.parametrize("file, fragment", [
    ("malformed.toml", "malformed.toml: not valid TOML"),
    ("bad_port.toml", "bad_port.toml: host[1].port"),
])
def test_bad_inventory(file: str, fragment: str, pictl_env, tmp_path: Path) -> None:
    _refused(["--hosts", str(BAD / file)], pictl_env, fragment, tmp_path)


@pytest.mark.parametrize("args, fragment", [
    (["--profile", "nope"], "unknown profile 'nope'"),
    (["--stages", "0"], "--stages: must be between 1 and 128 (got 0)"),
    (["--stages", "5"], "5 stages do not fit"),
    (["--data", "cifar10"], "needs data_path"),
    (["--model", "/nonexistent/pruned.safetensors"], "model artifact /nonexistent/pruned.safetensors: no such file"),
    (["--numerics", "int4"], "--numerics: must be 'fp32' or 'int8-dynamic' (got 'int4')"),
])
def test_refused_before_anything_runs(args: list[str], fragment: str, hosts: Path, pictl_env,
                                      tmp_path: Path) -> None:
    _refused(["--hosts", str(hosts), *args], pictl_env, fragment, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("make_args, fragment", [
    (lambda d: ["--stages", "2", "--checkpoint", str(d / "wrong.safetensors")], "the model expects [1000, 384]"),
    # `balanced` profiles the hosts before any plan: a model timm does not have is bad input there too (exit 2).
    (lambda d: ["--stages", "2", "--policy", "balanced", "--model", "nosuchnet"], "unknown model 'nosuchnet'"),
])
def test_refused_by_the_plan_on_the_first_host(make_args, fragment: str, hosts: Path, pictl_env,
                                               tmp_path: Path) -> None:
    """End to end: the host's planning step refuses, the controller says so in one line and cleans up."""
    if "wrong" in str(make_args(tmp_path)):
        state = materialize(create_meta_model("deit_small_patch16_224", 1000), seed=0, checkpoint=None).state_dict()
        save_file({**state, "head.weight": torch.zeros(10, 384)}, tmp_path / "wrong.safetensors")
    _refused(["--hosts", str(hosts), *make_args(tmp_path)], pictl_env, fragment, tmp_path)


@pytest.mark.parametrize("spec, fragment", [
    (lambda d: RunSpec(stages=2, split_points=["blocks.42"]),
     "split point 'blocks.42' is not a module of model 'deit_small_patch16_224'; its cuts: blocks.N"),
    (lambda d: RunSpec(stages=3, split_points=["blocks.3", "blocks.3.norm1"]), "are the same place"),
    (lambda d: RunSpec(stages=76), "75 is the most"),
    (lambda d: RunSpec(stages=2, checkpoint=str(d / "missing.safetensors")), "no such file"),
    (lambda d: RunSpec(stages=2, data=DataSpec(kind="cifar10", path=str(d / "nodata"))), "does not exist"),
    (lambda d: RunSpec(stages=2, numerics="int4"), "numerics 'int4' is not one of fp32, int8-dynamic"),
])
def test_the_plan_refuses(spec, fragment: str, tmp_path: Path) -> None:  # noqa: ANN001
    """The same planning step in this process (each CLI round trip costs a torch import on the host)."""
    with pytest.raises(BadInput) as refused:
        emit_plan(spec(tmp_path), Emitter("pipeline", stream=io.StringIO()))
    assert fragment in str(refused.value)
