"""The balanced policy on DeiT-S: measured costs, predictions, and a real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, run_pictl, write_cluster

from pictl.balance import CostTable, balanced_split, evaluate
from pictl.costs import LAN_LINK, profile_key
from pictl.inventory import load_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deit_costs() -> dict:
    proc = subprocess.run([sys.executable, "-m", "remote.costs", "--model", "deit_small_patch16_224"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    costs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert costs["event"] == "costs" and len(costs["pieces"]) == 75
    return costs


def _table(costs: dict, stages: int) -> CostTable:
    return CostTable(compute_s=[costs["compute_s"]] * stages, cut_bytes=costs["cut_bytes"],
                     links=[LAN_LINK] * (stages - 1), piece_bytes=costs["piece_bytes"])


def _starts(costs: dict, names: list[str]) -> list[int]:
    return [costs["pieces"].index(n) for n in names]


def test_costs_have_the_shape_of_deit_small(deit_costs: dict) -> None:
    pieces, cut = deit_costs["pieces"], deit_costs["cut_bytes"]
    # Between blocks one 197x384 fp32 tensor crosses; inside a block the residual rides along.
    assert cut[pieces.index("blocks.3")] == 197 * 384 * 4
    assert cut[pieces.index("blocks.3.attn.proj")] == 2 * 197 * 384 * 4
    assert cut[pieces.index("blocks.3.mlp.fc2")] == 197 * (1536 + 384) * 4
    attn, mlp = (deit_costs["compute_s"][pieces.index(n)] for n in ("blocks.3.attn", "blocks.3.mlp"))
    assert attn > 0 and mlp > 0 and sum(deit_costs["piece_bytes"]) == 4 * 22_050_664


def test_balanced_is_no_worse_than_hand_splits_and_beats_equal_at_five(deit_costs: dict) -> None:
    from remote.spec import RunSpec
    from remote.stage import layout_for

    four = _table(deit_costs, 4)
    hand = evaluate(four, _starts(deit_costs, ["blocks.3", "blocks.6", "blocks.9"]))
    assert balanced_split(four).bottleneck_s <= hand.bottleneck_s
    five = _table(deit_costs, 5)
    equal = [s.first for s in layout_for(RunSpec(stages=5, policy="equal")).stages[1:]]
    assert balanced_split(five).bottleneck_s < evaluate(five, equal).bottleneck_s


def _seed_profiles(cache_root, hosts, costs: dict, slow: dict[str, float] | None = None) -> None:
    """Cost profiles as `pictl profile` would cache them, from the measured DeiT-S costs."""
    from pictl.cache import JsonCache

    cache = JsonCache(cache_root / "costs")
    for host in load_cluster(hosts).hosts:
        factor = (slow or {}).get(host.name, 1.0)
        cache.put(profile_key(host, "deit_small_patch16_224", 1000, 1, 1),
                  {**{k: costs[k] for k in ("pieces", "cut_bytes", "piece_bytes")}, "chunk": 1, "threads": 1,
                   "compute_s": [t * factor for t in costs["compute_s"]], "torch": "cached"})


def test_balanced_run_predicts_and_measures_each_stage(deit_costs: dict, tmp_path, pictl_env) -> None:
    """h1's cached profile is used; h0's is truncated, so it is measured again on the host."""
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    _seed_profiles(tmp_path / "cache", hosts, deit_costs)
    h0 = load_cluster(hosts).hosts[0]
    cached = tmp_path / "cache" / "costs" / f"{profile_key(h0, 'deit_small_patch16_224', 1000, 1, 1)}.json"
    cached.write_text(cached.read_text()[:200])
    proc = run_pictl(["run", "--hosts", str(hosts), "--stages", "2", "--policy", "balanced", "--images", "6",
                      "--warmup", "0", "--repeats", "1", "--headless", "--json"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["policy"] == "balanced" and s["outputs_match"] is True and len(s["split_points"]) == 1
    assert s["prediction"]["profiled"] == ["h0"] and len(s["prediction"]["stage_ms"]) == 2
    assert all(st["predicted_ms"] > 0 and st["measured_ms"] > 0 for st in s["per_stage"])
    assert "predicted" in proc.stderr
    assert json.loads(cached.read_text())["torch"] != "cached"  # measured on the host, cached again


def test_fewer_stages_than_hosts_take_the_fastest(deit_costs: dict, tmp_path, pictl_env) -> None:
    """h1 measured twice as slow as h0 and h2 (its cached profile says so): 2 stages go to h0 and h2."""
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 3)
    _seed_profiles(tmp_path / "cache", hosts, deit_costs, slow={"h1": 2.0})
    proc = run_pictl(["run", "--hosts", str(hosts), "--stages", "2", "--policy", "balanced", "--images", "4",
                      "--warmup", "0", "--repeats", "1", "--headless", "--json"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert [st["host"] for st in s["per_stage"]] == ["h0", "h2"] and s["outputs_match"] is True
    assert s["prediction"]["profiled"] == [] and "fastest hosts: h0" in proc.stderr and "left out: h1" in proc.stderr
    assert s["prediction"]["links_measured"] == ["h0->h2"]
