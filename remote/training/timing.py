"""Where a training step's time goes on one rank, measured as it runs.

    data_s       fetching the step's images and labels
    forward_s    the forward computation (the loss included)
    backward_s   the backward computation
    optimizer_s  the optimizer step (and the learning-rate schedule)
    comm_s       blocked on communication: under `pipeline`, waiting on sends and receives between
                 stages (which includes waiting while the neighbour computes: the fill/drain bubble);
                 under `ddp`, the all-reduce left to wait for once the backward computation is done
                 (the part of it that overlapped the backward is counted there, and reported apart)
    idle_s       the rest of the step's wall time (bookkeeping, the loss shared for reporting)

The categories add up to the step's wall time on each rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage


@dataclass
class StepTimes:
    data_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    comm_s: float = 0.0
    idle_s: float = 0.0

    def add(self, other: StepTimes) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def close(self, wall_s: float) -> None:
        """Whatever the categories did not cover of the step's `wall_s` is idle."""
        covered = self.data_s + self.forward_s + self.backward_s + self.optimizer_s + self.comm_s
        self.idle_s = max(0.0, wall_s - covered)

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in asdict(self).items()}


def autocast(enabled: bool) -> AbstractContextManager:
    """bf16 autocast on the CPU (the weights, gradients and optimizer stay fp32)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


class TrainStage(PipelineStage):
    """A PipelineStage that times its forward and backward computation (autocast around the forward)."""

    def __init__(self, *args, amp: bool = False, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.amp = amp
        self.forward_s = self.backward_s = 0.0
        self.bytes_sent = 0
        self.grad_bytes_sent = 0
        """Gradients of this stage's inputs sent back to the previous stage (the backward half of the link)."""
        self._input_bytes = sum(t.numel() * t.element_size() for t in kwargs.get("input_args") or ())

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):  # noqa: ANN001, ANN201
        start = time.perf_counter()
        with autocast(self.amp):
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.forward_s += time.perf_counter() - start
        if not self.is_last:
            outs = out if isinstance(out, tuple) else (out,)
            self.bytes_sent += sum(t.numel() * t.element_size() for t in outs)
        return out

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):  # noqa: ANN001, ANN201
        start = time.perf_counter()
        out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                         last_backward=last_backward)
        self.backward_s += time.perf_counter() - start
        if not self.is_first:  # one gradient a received tensor, of its shape and dtype
            self.grad_bytes_sent += self._input_bytes
        return out

    def take(self) -> tuple[float, float]:
        """This step's forward and backward seconds (and start the next step's count)."""
        out = (self.forward_s, self.backward_s)
        self.forward_s = self.backward_s = 0.0
        return out


class AllReduceClock:
    """A DDP communication hook: averages each gradient bucket as DDP's default hook does, and notes when
    the backward computation handed over its last bucket, and how long the all-reduces took in all."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.last_bucket_at = 0.0
        self.reduce_s = 0.0
        self.bytes = 0

    def hook(self, _state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        start = self.last_bucket_at = time.perf_counter()
        buffer = bucket.buffer().div_(self.world)
        self.bytes += buffer.numel() * buffer.element_size()
        future = dist.all_reduce(buffer, async_op=True).get_future()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.reduce_s += time.perf_counter() - start
            return fut.value()[0]

        return future.then(done)


def timed(work: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = work()
    return out, time.perf_counter() - start
