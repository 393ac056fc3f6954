"""A rank's inputs to a pipelining schedule, passed the way the installed torch takes them
(`remote.floor.torch_support`).

torch 2.14 takes the microbatches pre-split (`arg_mbs=[(x0,), ...]`, `target_mbs=[y0, ...]`); 2.13 takes
the whole batch (`step(x, target=y)`) and cuts it into `n_microbatches` along the first dimension itself.
Every microbatch pictl makes has the same size (the last one is padded: `remote.data.images.microbatches`,
`remote.training.data`), so that cut gives back exactly the microbatches given: both ways compute the same
thing. The whole batch is put together once, when the inputs are made, not inside a timed pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from remote.floor.torch_support import takes_pre_split

PRE_SPLIT = takes_pre_split(torch.__version__)
"""Whether this torch's `step`/`eval` take pre-split microbatches."""


@dataclass(frozen=True)
class ScheduleInputs:
    """What one call of `schedule.step` or `schedule.eval` is given on this rank."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def eval(self, schedule: Any) -> Any:
        """A forward-only pass: the last stage's merged output (None on the other stages)."""
        return schedule.eval(*self.args, **self.kwargs)

    def step(self, schedule: Any, **options: Any) -> Any:
        """A training step (`options`: `losses`, `return_outputs`)."""
        return schedule.step(*self.args, **self.kwargs, **options)


def schedule_inputs(microbatches: list[torch.Tensor] | None, targets: list[torch.Tensor] | None = None, *,
                    pre_split: bool = PRE_SPLIT) -> ScheduleInputs:
    """This rank's inputs: its microbatches (first stage; None elsewhere) and their targets (last stage, where
    the schedule computes a loss; None elsewhere), pre-split or as whole batches."""
    if pre_split:
        kwargs: dict[str, Any] = {}
        if microbatches is not None:
            kwargs["arg_mbs"] = [(mb,) for mb in microbatches]
        if targets is not None:
            kwargs["target_mbs"] = list(targets)
        return ScheduleInputs((), kwargs)
    return ScheduleInputs((torch.cat(microbatches),) if microbatches is not None else (),
                          {"target": torch.cat(targets)} if targets is not None else {})
