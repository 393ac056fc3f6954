"""Serial throughput of DeiT-S unpruned and pruned at several ratios, measured side by side.

    .venv/bin/python -m bench.prune [--ratios 0.1,0.15,0.3] [--threads 1] [--chunk 1] [--images 16] [--rounds 5]
                                    [--quick]

Each ratio is pruned once (`remote.prune.prune_model`, L2 importance, uniform: every
importance gives the same shapes at a uniform ratio, and speed depends only on shapes).
Then the models take turns, one timed pass of `--images` images each per round, so
drift in the machine's speed (thermal, other load) hits every model alike. Prints
img/s (median over rounds), parameters, MACs, and each figure over the unpruned one. `--quick`: the ratio
0.15 only, 2 images, 1 round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from bench.harness import add_quick, quick_defaults
from remote.floor.spec import PruneSpec
from remote.pruning.prune import count_macs, prune_model
from remote.toolkit.model import create_meta_model, materialize

MODEL = "deit_small_patch16_224"


def build(ratio: float | None, example: torch.Tensor) -> torch.nn.Module:
    model = materialize(create_meta_model(MODEL, 1000), seed=0, checkpoint=None)
    if ratio:
        prune_model(model, PruneSpec(ratio=ratio, importance="l2"), example, [], torch.device("cpu"))
    return model.eval()


@torch.no_grad()
def one_pass(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for b in batches:
        model(b)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", default="0.1,0.15,0.3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), ratios="0.15", images=2, rounds=1)
    torch.set_num_threads(args.threads)
    ratios = [float(r) for r in args.ratios.split(",")]
    example = torch.randn(1, 3, 224, 224)
    models = {"unpruned": build(None, example)} | {f"ratio {r}": build(r, example) for r in ratios}
    batches = list(torch.randn(args.images, 3, 224, 224).split(args.chunk))
    times: dict[str, list[float]] = {name: [] for name in models}
    for m in models.values():
        one_pass(m, batches[:1])  # warm-up: first-call allocations
    for _ in range(args.rounds):
        for name, m in models.items():
            times[name].append(one_pass(m, batches))

    print(f"{MODEL}, serial, {args.threads} thread(s), chunk {args.chunk}, {args.images} images x "
          f"{args.rounds} interleaved rounds, torch {torch.__version__}")
    print(f"{'model':<12} {'params':>12} {'GMACs':>7} {'img/s':>8} {'spread':>7} {'x unpruned':>11} "
          f"{'params x':>9} {'MACs x':>7}")
    base_ips = base_params = base_macs = None
    for name, m in models.items():
        macs, params = count_macs(m, example)
        ips = args.images / statistics.median(times[name])
        spread = (max(times[name]) - min(times[name])) / statistics.median(times[name])
        base_ips, base_params, base_macs = base_ips or ips, base_params or params, base_macs or macs
        print(f"{name:<12} {params:>12,} {macs / 1e9:>7.2f} {ips:>8.2f} {spread:>6.0%} {ips / base_ips:>10.2f}x "
              f"{params / base_params:>8.2f}x {macs / base_macs:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
