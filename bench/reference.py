"""Plain references for pictl's throughput figures, with no pictl code in them.

    python reference.py serial --model deit_small_patch16_224 --images 48 --chunk 1 --warmup 1 --repeats 3
    .venv/bin/python -m bench.reference --quick      (serial, 2 images, 1 pass: a smoke run)
    torchrun --nnodes N --nproc-per-node 1 --node-rank I --rdzv-backend static --master-addr A --master-port P \\
        reference.py pipeline --split blocks.3,blocks.6,blocks.9 --images 48 --chunk 1 --warmup 1 --repeats 3

`serial` runs the whole timm model in a loop over batches of `--chunk` images.
`pipeline` is torch.distributed.pipelining's manual frontend as its documentation
shows it: each rank wraps its part of the eager timm model (the embedding and
blocks before the first split, the blocks between two splits, the last blocks and
the head; splits are block boundaries, `blocks.N`) in a `PipelineStage`, and
ScheduleGPipe runs the microbatches over gloo. (The tracer frontend, `pipeline()`,
runs torch.export's graph of the model, which measured 18 % slower per image than
the eager model here: its speedup would be understated.) Both time each pass the
way pictl does (the pipeline: from a barrier to the end of the schedule on the last
rank) and print one JSON line, the pipeline on its last rank only:
{"mode", "ips": [one per timed pass], "mean_ips", ...}.

Runs on the hosts with nothing but torch and timm (the venv pictl provisions): it stays a standalone script
(no bench imports), since bench.check_speedup copies it to SSH hosts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any

import timm
import torch


def _model(args: argparse.Namespace) -> Any:  # a timm model: its parts are attributes torch's types cannot see
    torch.manual_seed(args.seed)
    return timm.create_model(args.model, pretrained=False, num_classes=args.num_classes).eval()


def _images(args: argparse.Namespace, model: Any) -> torch.Tensor:
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return torch.randn(args.images, *size, generator=torch.Generator().manual_seed(args.seed))


def _report(args: argparse.Namespace, mode: str, seconds: list[float], **extra: object) -> None:
    ips = [round(args.images / s, 4) for s in seconds[args.warmup:]]
    print(json.dumps({"mode": mode, "model": args.model, "images": args.images, "chunk": args.chunk,
                      "threads": torch.get_num_threads(), "ips": ips, "mean_ips": round(statistics.fmean(ips), 4),
                      **extra}), flush=True)


def serial(args: argparse.Namespace) -> None:
    model = _model(args)
    batches = _images(args, model).split(args.chunk)
    seconds = []
    with torch.no_grad():
        for _ in range(args.warmup + args.repeats):
            start = time.perf_counter()
            for batch in batches:
                model(batch)
            seconds.append(time.perf_counter() - start)
    _report(args, "serial", seconds)


class Part(torch.nn.Module):
    """Blocks [first, end) of a timm VisionTransformer, after its embedding on the first stage and before its
    norm and head on the last: `VisionTransformer.forward_features` and `forward_head`, cut at block boundaries."""

    def __init__(self, model: Any, first: int, end: int) -> None:
        super().__init__()
        self.model, self.first, self.end = model, first, end

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        if self.first == 0:
            x = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))
        for block in m.blocks[self.first:self.end]:
            x = block(x)
        if self.end == len(m.blocks):
            x = m.forward_head(m.norm(x))
        return x


def pipeline(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if args.images % args.chunk:
        sys.exit("images must be a multiple of chunk (uneven microbatches are not supported upstream)")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model(args)
    images = _images(args, model)
    split = [p for p in args.split.split(",") if p]
    if len(split) + 1 != world or not all(p.startswith("blocks.") and p[7:].isdigit() for p in split):
        sys.exit(f"--split: {world} ranks need {world - 1} block boundaries (blocks.N), not {split}")
    bounds = [0, *(int(p[7:]) for p in split), len(model.blocks)]
    parts = [Part(model, a, b) for a, b in itertools.pairwise(bounds)]
    with torch.no_grad():  # the shapes between stages, from one microbatch through the eager parts
        shapes, x = [], images[: args.chunk]
        for part in parts:
            shapes.append(tuple(x.shape))
            x = part(x)
        shapes.append(tuple(x.shape))
    stage = PipelineStage(parts[rank], rank, world, torch.device("cpu"),
                          input_args=(torch.empty(shapes[rank], device="meta"),),
                          output_args=(torch.empty(shapes[rank + 1], device="meta"),))
    schedule = ScheduleGPipe(stage, n_microbatches=args.images // args.chunk)
    microbatches = [(mb,) for mb in images.split(args.chunk)]
    seconds = []
    with torch.no_grad():
        for _ in range(args.warmup + args.repeats):
            dist.barrier()
            start = time.perf_counter()
            out = schedule.eval(arg_mbs=microbatches) if rank == 0 else schedule.eval()
            seconds.append(time.perf_counter() - start)
        # The reference must compute what the whole model does: its first microbatch, compared.
        same = bool(torch.equal(out[: args.chunk], model(images[: args.chunk]))) if rank == world - 1 else None
    dist.barrier()
    if rank == world - 1:
        _report(args, "pipeline", seconds, stages=world, split=split, matches_model=same)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("serial", "pipeline"), nargs="?", default="serial")
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--split", default="", help="module names where stages 2..N begin (pipeline)")
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 images, no warm-up, 1 timed pass")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.chunk, args.warmup, args.repeats = 2, 1, 0, 1
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    serial(args) if args.mode == "serial" else pipeline(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
