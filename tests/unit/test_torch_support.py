"""The torch range the hosts may have, and the two ways a rank hands its batch to a schedule.

The installed torch (the pin) runs both ways here for real: a one-stage schedule in a gloo group of one
gives the same logits, losses and gradients whether its microbatches go in pre-split (2.14's way) or as the
whole batch (the only way 2.13 takes). Which way a rank takes is chosen by its torch's version; a real run
on 2.13.0 (docs/install.md) took the whole-batch way.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from remote.floor.torch_support import RANGE, release, supported, takes_pre_split, unsupported
from remote.toolkit.schedule_inputs import PRE_SPLIT, schedule_inputs


@pytest.mark.parametrize(("version", "found", "ok", "pre_split"), [
    ("2.14.1+cu130", (2, 14), True, True),
    ("2.14.0rc1", (2, 14), True, True),
    ("2.13.0+cpu", (2, 13), True, False),
    ("2.12.1", (2, 12), False, False),
    ("2.11.0", (2, 11), False, False),
    ("2.15.0.dev20260101+cpu", (2, 15), False, True),
    ("1.13.1", (1, 13), False, False),
    ("3.0.0", (3, 0), False, True),
    ("2.130.0", (2, 130), False, True),
    ("nightly", None, False, False),
    ("", None, False, False),
])
def test_versions_are_read_by_release(version: str, found: tuple[int, int] | None, ok: bool, pre_split: bool) -> None:
    assert release(version) == found
    assert supported(version) is ok
    assert takes_pre_split(version) is pre_split
    assert (unsupported(version) is None) is ok


def test_what_an_unsupported_torch_is_told() -> None:
    assert RANGE == "torch >= 2.13, < 2.15"
    assert unsupported("2.11.0") == "has torch 2.11.0, outside the range pictl runs on (torch >= 2.13, < 2.15)"
    assert unsupported(None) == "has no torch (torch >= 2.13, < 2.15)"


def test_the_installed_torch_is_in_the_range_and_its_schedules_take_what_the_rule_says() -> None:
    """The rule by version against the installed torch's own signature: a pin moved to a torch whose `eval`
    changed fails here, not on a host."""
    assert supported(torch.__version__), f"the pinned torch {torch.__version__} is outside {RANGE}"
    takes = "arg_mbs" in inspect.signature(ScheduleGPipe.eval).parameters
    assert takes is takes_pre_split(torch.__version__) is PRE_SPLIT


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _schedule(model: nn.Module, n_mb: int, loss: bool) -> ScheduleGPipe:
    stage = PipelineStage(model, 0, 1, torch.device("cpu"))
    return ScheduleGPipe(stage, n_microbatches=n_mb, loss_fn=nn.functional.cross_entropy if loss else None)


def test_both_ways_of_passing_a_batch_compute_the_same(group_of_one) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 5))
    mbs = [torch.randn(3, 12) for _ in range(4)]
    targets = [torch.randint(0, 5, (3,)) for _ in range(4)]

    outputs = []
    for pre_split in (True, False):
        with torch.no_grad():
            outputs.append(schedule_inputs(mbs, pre_split=pre_split).eval(_schedule(model, 4, loss=False)))
    assert outputs[0].shape == (12, 5) and torch.equal(outputs[0], outputs[1])
    with torch.no_grad():
        assert torch.equal(outputs[0], torch.cat([model(mb) for mb in mbs]))  # the microbatches given, in order

    trained = []
    for pre_split in (True, False):
        model.zero_grad()
        losses: list[torch.Tensor] = []
        schedule_inputs(mbs, targets, pre_split=pre_split).step(_schedule(model, 4, loss=True), losses=losses,
                                                                return_outputs=False)
        trained.append(([float(v.detach()) for v in losses], [p.grad.clone() for p in model.parameters()]))
    assert len(trained[0][0]) == 4 and trained[0][0] == trained[1][0]
    assert all(torch.equal(a, b) for a, b in zip(trained[0][1], trained[1][1], strict=True))
