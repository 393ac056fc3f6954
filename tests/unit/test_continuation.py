"""When a run that lost a host goes on, and when it ends instead (`pictl.run.continuation.cannot_continue`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import ROOT

from pictl import errors as E
from pictl.cluster.ranks import NodePlan
from pictl.inventory import load_cluster
from pictl.planning.options import RunOptions
from pictl.records.runs import PendingRecord
from pictl.run.baselines import BaselineCache
from pictl.run.context import Caches, RunContext
from pictl.run.continuation import cannot_continue
from pictl.run.logbook import Logbook
from pictl.run.placement import Placement


def _why(tmp_path: Path, options: RunOptions, *, hosts: int = 3, lost: str = "local1", passes_done: int = 1,
         comparison: bool = False) -> str | None:
    cluster = load_cluster(ROOT / "hosts.toml")
    ctx = RunContext(cluster, options, "run", lambda _e: None, tmp_path, Caches.beside(BaselineCache(tmp_path / "b")),
                     pushed={})
    nodes = tuple(NodePlan(cluster.hosts[i], i, i, 1) for i in range(hosts))
    placement = Placement(nodes, {n.host.name: 1 for n in nodes}, 1)
    book = Logbook(PendingRecord(tmp_path, "run"))
    book.telemetry.throughputs += [5.0] * passes_done
    failure = E.HostLost.on(lost, 1, "the pipeline", "the rank died without reporting an error")
    return cannot_continue(ctx, placement, failure, book, comparison=comparison)


@pytest.mark.parametrize(("options", "kwargs", "why"), [
    (RunOptions(stages=3, policy="equal"), {}, None),
    (RunOptions(stages=3, policy="equal", split=["blocks.4", "blocks.8"]), {}, None),  # explicit: equal goes on
    (RunOptions(stages=3, on_host_loss="fail"), {}, "--on-host-loss fail"),
    (RunOptions(stages=3), {"comparison": True}, "a run of a sweep or tune is measured whole"),
    (RunOptions(stages=2, replicas=2, images=48), {"hosts": 4}, "a run with replicas ends"),
    (RunOptions(stages=3, split=["blocks.4", "blocks.8"], wire="blocks.4=fp16"), {}, "names its cuts"),
    (RunOptions(stages=2), {"hosts": 2}, "only local0 is left: a pipeline needs two stages"),
    (RunOptions(stages=3, repeats=3), {"passes_done": 3}, "every timed pass had finished"),
])
def test_a_run_goes_on_without_a_lost_host_unless_it_cannot(tmp_path: Path, options: RunOptions, kwargs: dict,
                                                            why: str | None) -> None:
    found = _why(tmp_path, options, **kwargs)
    assert found == why if why is None else (found is not None and why in found), found
