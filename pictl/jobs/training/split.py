"""`--policy balanced` for training: the inference cost profiles, read as a training step sees them.

A training microbatch crosses every piece forward and backward: backward costs about twice the forward
(each layer computes the gradients of its input and of its weights), so each piece's profiled forward
time is tripled; and each cut carries the activations forward and their gradients back, so its bytes
count twice. The split with the smallest bottleneck over that table is the one the ranks get.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from pictl import errors as E
from pictl.cluster.fleet import Fleet
from pictl.jobs.training.options import TrainOptions
from pictl.planning.costs import cost_table, host_profiles, link_profiles
from pictl.records.cache import JsonCache, cache_root
from remote.floor.balance import NoFeasibleSplit, balanced_split

BACKWARD_FACTOR = 3.0
"""Forward + backward over forward, per piece."""
CUT_CROSSINGS = 2.0
"""Activations forward, gradients back."""


async def balanced_points(fleet: Fleet, stage_hosts: list[str], options: TrainOptions, code: str,
                          ) -> tuple[list[str], dict[str, Any]]:
    """The split points, and what was predicted for them (ms per microbatch, forward and backward)."""
    o = options
    root = cache_root()
    profiles = await host_profiles(fleet.only(dict.fromkeys(stage_hosts)), JsonCache(root / "costs"), model=o.model,
                                   num_classes=o.classes or 10, chunk=o.batch_size // o.chunks, threads=o.threads,
                                   code=code)
    hops = [(fleet[a], fleet[b]) for a, b in itertools.pairwise(stage_hosts) if a != b]
    links, _ = await link_profiles(hops, JsonCache(root / "links"))
    table = cost_table(stage_hosts, profiles, links, wire_ratio=CUT_CROSSINGS)
    table = replace(table, compute_s=[[t * BACKWARD_FACTOR for t in row] for row in table.compute_s])
    try:
        split = balanced_split(table)
    except NoFeasibleSplit as exc:
        raise E.ConfigError(f"policy balanced: {exc}") from None
    pieces = profiles.profile(stage_hosts[0]).pieces
    return [pieces[i] for i in split.starts], {
        "stage_ms": [round(s * 1000, 3) for s in split.stage_s], "link_ms": [round(s * 1000, 3) for s in split.link_s],
        "bottleneck_ms": round(split.bottleneck_s * 1000, 3), "profiled": profiles.measured,
        "backward_factor": BACKWARD_FACTOR}
