"""One rank's share of a training step, per mode: the whole model (`single`, and `ddp` with
DistributedDataParallel over gloo) or one pipeline stage (`pipeline`, torch.distributed.pipelining).

Every mode computes the gradient of the mean loss over the step's microbatches: the microbatches'
gradients are summed and divided by their count (the pipeline schedule's `scale_grads`; the whole
model does the same by hand; under ddp the all-reduce averages over ranks and each rank divides by
its own share), so after the same steps every mode holds the same weights up to rounding.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from peft.tuners.lora import LoraModel

from remote.floor.spec import TrainSpec
from remote.floor.wire import WireFormat
from remote.toolkit.codec import Codec, payload_meta
from remote.toolkit.model import Checkpoint
from remote.toolkit.schedule_inputs import schedule_inputs
from remote.toolkit.stage import ModelLayout, StageModule, build_stage, stage_codec, stage_io_shapes
from remote.training.data import Labelled
from remote.training.lora import add_lora
from remote.training.timing import AllReduceClock, StepTimes, TrainStage, autocast

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def optimizer(params: list[nn.Parameter], spec: TrainSpec, steps: int,
              ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The same optimizer and cosine schedule (over all steps) on every rank and in every mode."""
    if spec.optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps))


class _Fp32Outputs(nn.Module):
    """A stage whose outputs travel as fp32 whatever autocast computed them in (the stages are built for
    fp32 buffers, and bf16 -> fp32 -> bf16 is exact, so the next stage computes what it would have)."""

    def __init__(self, stage: StageModule) -> None:
        super().__init__()
        self.stage = stage
        codec = stage.codec
        self.encoded = codec is not None and codec.fmt_out is not None and codec.fmt_out.kind != "fp32"
        """A `--wire` format leaves as its own dtypes (fp16, bf16, lowrank's fp32 factors)."""

    def forward(self, *state: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = self.stage(*state)
        if self.encoded:
            return out
        if isinstance(out, tuple):
            return tuple(t.float() for t in out)
        return out.float()


def _trainable(spec: TrainSpec, layout: ModelLayout, stage: int, checkpoint: Checkpoint | None,
               codec: Codec | None = None) -> tuple[StageModule, LoraModel | None]:
    """A stage (the whole model under single and ddp) in training mode: every weight trains, or with `--lora`
    the adapters and the head (`remote.training.lora`)."""
    module = build_stage(spec, layout, layout.stages[stage], checkpoint, codec).train()
    module.checkpointed = spec.checkpoint_activations
    return module, add_lora(module.model, spec.model, spec.lora, spec.seed) if spec.lora else None


class Worker:
    """What every mode offers the training loop."""

    module: StageModule
    lora: LoraModel | None
    """The adapters `--lora` added (merged into the weights before the model is evaluated and written)."""
    holds_loss: bool
    """This rank sees the step's loss (and evaluates)."""

    def step(self, micro: list[list[int]], data: Labelled) -> tuple[float | None, StepTimes]:
        raise NotImplementedError

    def logits(self, images: list[torch.Tensor | None]) -> torch.Tensor | None:
        """The model's logits for `images`, a list of microbatches (None where this rank does not read
        images), on the rank that holds the output; None elsewhere."""
        raise NotImplementedError


class _Optimized:
    def _init_optimizer(self, spec: TrainSpec, steps: int, rank: int) -> None:
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.opt, self.sched = optimizer(self.params, spec, steps)
        self.frozen = spec.break_rank == rank  # fault injection: this rank never updates its weights

    def _apply(self, scale: int) -> float:
        start = time.perf_counter()
        if scale != 1:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(scale)
        if not self.frozen:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        return time.perf_counter() - start


class WholeModel(Worker, _Optimized):
    """`single` (world 1) and `ddp`: rank r takes microbatches r, r + world, ... of every step."""

    def __init__(self, spec: TrainSpec, layout: ModelLayout, checkpoint: Checkpoint | None, *, rank: int,
                 world: int, steps: int) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        self.module, self.lora = _trainable(spec, layout, 0, checkpoint)
        self.holds_loss = rank == 0
        self.clock = AllReduceClock(world)
        self.net: nn.Module = self.module
        if world > 1:
            # Buffers are not broadcast at every forward: BatchNorm keeps each rank's own statistics, and
            # rank 0's are the ones evaluated and saved.
            self.net = DistributedDataParallel(self.module, broadcast_buffers=False)
            # (A plain function: DDP checks the hook's annotations, which are strings in this module.)
            self.net.register_comm_hook(None, lambda state, bucket: self.clock.hook(state, bucket))
        self._init_optimizer(spec, steps, rank)

    def step(self, micro: list[list[int]], data: Labelled) -> tuple[float | None, StepTimes]:
        mine = micro[self.rank::self.world]
        times = StepTimes()
        loss_sum = 0.0
        for j, idx in enumerate(mine):
            start = time.perf_counter()
            x, y = data.take(idx), data.labels[idx]
            times.data_s += time.perf_counter() - start
            sync = j == len(mine) - 1
            with self.net.no_sync() if self.world > 1 and not sync else nullcontext():  # type: ignore[operator]
                start = time.perf_counter()
                with autocast(self.spec.amp):
                    loss = F.cross_entropy(self.net(x), y)
                times.forward_s += time.perf_counter() - start
                start = time.perf_counter()
                loss.backward()
                end = time.perf_counter()
            if self.world > 1 and sync:
                # The all-reduces overlap the backward: only what is left once the last bucket is handed
                # over is waiting on communication.
                handed = max(start, self.clock.last_bucket_at)
                times.backward_s += handed - start
                times.comm_s += end - handed
            else:
                times.backward_s += end - start
            loss_sum += float(loss.detach())
        times.optimizer_s = self._apply(len(mine))
        if self.world == 1:
            return loss_sum, times
        total = torch.tensor([loss_sum])
        torch.distributed.all_reduce(total)
        return float(total[0]), times

    def logits(self, images: list[torch.Tensor | None]) -> torch.Tensor | None:
        if self.rank != 0:
            return None
        self.module.eval()
        try:
            with torch.no_grad(), autocast(self.spec.amp):
                return torch.cat([self.module(x).float() for x in images if x is not None])
        finally:
            self.module.train()


class PipelineStageWorker(Worker, _Optimized):
    """`pipeline`: rank r holds stage r; the schedule drives forward, loss (last stage) and backward."""

    def __init__(self, spec: TrainSpec, layout: ModelLayout, checkpoint: Checkpoint | None, *, rank: int,
                 world: int, steps: int) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        codec = stage_codec(spec, layout, rank)  # type: ignore[arg-type]  (a TrainSpec has the wire it reads)
        self.module, self.lora = _trainable(spec, layout, rank, checkpoint, codec)
        in_shapes, out_shapes = stage_io_shapes(layout, spec.microbatch)[rank]
        fp32 = WireFormat("fp32")
        # The example tensors carry `requires_grad`: it is what makes the stage receive and send gradients. With
        # `--wire`, they are the payload's (its dtypes and shapes): the gradients come back in the same form.
        # The first stage takes the model's input as it is (a text model's: token ids, which carry no gradient).
        inputs = (layout.input_meta(spec.microbatch),) if rank == 0 else \
            tuple(t.requires_grad_(True) for t in payload_meta(codec.fmt_in or fp32, list(in_shapes)))
        self.stage = TrainStage(_Fp32Outputs(self.module), rank, world, torch.device("cpu"), input_args=inputs,
                                output_args=tuple(t.requires_grad_(True) for t in
                                                  payload_meta(codec.fmt_out or fp32, list(out_shapes))),
                                amp=spec.amp)
        self.schedule = SCHEDULES[spec.schedule](self.stage, n_microbatches=spec.chunks, loss_fn=F.cross_entropy)
        self.first, self.last = rank == 0, rank == world - 1
        self.holds_loss = self.last
        self._init_optimizer(spec, steps, rank)

    @property
    def bytes_sent(self) -> int:
        return self.stage.bytes_sent

    @property
    def grad_bytes_sent(self) -> int:
        return self.stage.grad_bytes_sent

    def step(self, micro: list[list[int]], data: Labelled) -> tuple[float | None, StepTimes]:
        times = StepTimes()
        start = time.perf_counter()
        x = [data.take(idx) for idx in micro] if self.first else None
        y = [data.labels[idx] for idx in micro] if self.last else None
        inputs = schedule_inputs(x, y)
        times.data_s = time.perf_counter() - start
        losses: list[torch.Tensor] | None = [] if self.last else None
        if self.module.codec is not None:
            self.module.codec.expect(micro)
        start = time.perf_counter()
        inputs.step(self.schedule, losses=losses, return_outputs=False)
        spent = time.perf_counter() - start
        times.forward_s, times.backward_s = self.stage.take()
        times.comm_s = max(0.0, spent - times.forward_s - times.backward_s)
        times.optimizer_s = self._apply(1)  # the schedule already divided the gradients by the microbatches
        return (sum(float(v.detach()) for v in losses) if losses is not None else None), times

    def logits(self, images: list[torch.Tensor | None]) -> torch.Tensor | None:
        """Forward only, `chunks` microbatches at a time (the schedule's shape); `images` is padded to it."""
        self.module.eval()
        out = []
        try:
            with torch.no_grad():
                for i in range(0, len(images), self.spec.chunks):
                    group = images[i:i + self.spec.chunks]
                    blank = torch.zeros(self.spec.microbatch, dtype=torch.long)
                    targets = [blank for _ in group] if self.last else None
                    logits = schedule_inputs(group if self.first else None, targets).eval(self.schedule)
                    if self.last:
                        out.append(logits.float())
            self.stage.take()  # evaluation is not part of any step's figures
        finally:
            self.module.train()
        return torch.cat(out) if self.last else None
