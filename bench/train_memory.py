"""Training's memory-for-compute and loading trades, measured side by side in one run.

    .venv/bin/python -m bench.train_memory [--rounds 3] [--depth 12] [--batch-size 8] [--steps 4] [--quick]

1. Activation checkpointing: `pictl train --mode single` on a DeiT-S-width ViT (--depth blocks, 224 px,
   synthetic data) with and without `--checkpoint-activations`, in alternating rounds: the rank's peak RSS
   and samples/s of each, and their ratios.
2. Data-loading workers: `pictl sweep --train --modes single --workers 0,1,2` on scikit-learn's digits
   written as an ImageFolder, at 224 px (512 images: more than pictl decodes once into memory, so real PNGs
   are decoded and resized at every step) with a small ViT (patch 32, 2 blocks of width 96: cheap compute,
   so reading is a large share of a step): each worker count's samples/s and the data-loading share.
Everything on one local host of this machine (its cores: see `nproc`); the figures are this machine's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.harness import Pictl, add_quick, alternate, cluster, quick_defaults, save_result
from tests.support.digits import write_digits


def checkpointing(pictl: Pictl, hosts: Path, args: argparse.Namespace) -> dict:
    model = ["--model", "vit_tiny_patch16_224", "--model-arg", "embed_dim=384", "--model-arg", "num_heads=6",
             "--model-arg", f"depth={args.depth}"]
    common = ["train", "--hosts", str(hosts), "--mode", "single", *model, "--batch-size", str(args.batch_size),
              "--chunks", "1", "--steps", str(args.steps), "--train-images", str(args.batch_size * args.steps),
              "--eval-images", "0", "--check-steps", "0", "--no-save"]
    got: dict[str, list[tuple[float, float]]] = {"kept": [], "recomputed": []}
    for r in range(args.rounds):
        for how in alternate(["kept", "recomputed"], r):
            s = pictl(*common, *(["--checkpoint-activations"] if how == "recomputed" else []))
            peak = max(b["peak_rss_mb"] for b in s["breakdown"])
            got[how].append((peak, s["samples_per_s"]))
            print(f"round {r + 1}: {how:10s} peak RSS {peak:7.1f} MB, {s['samples_per_s']:6.2f} samples/s", flush=True)
    med = {how: (statistics.median(p for p, _ in v), statistics.median(x for _, x in v)) for how, v in got.items()}
    print(f"activation checkpointing ({args.depth} blocks, batch {args.batch_size}): peak RSS "
          f"{med['recomputed'][0]:.0f} MB against {med['kept'][0]:.0f} MB ({med['kept'][0] - med['recomputed'][0]:.0f} "
          f"MB less), samples/s x{med['recomputed'][1] / med['kept'][1]:.2f} (medians of {args.rounds})")
    return {"rounds": got, "medians": med}


def loader_workers(pictl: Pictl, hosts: Path, args: argparse.Namespace, data: Path) -> dict:
    rows_by_round = []
    for r in range(args.rounds):
        out = pictl.workdir / f"workers-{r}"
        result = pictl("sweep", "--train", "--hosts", str(hosts), "--out", str(out), "--modes", "single",
                       "--chunks", "1", "--workers", "0,1,2", "--model", "vit_tiny_patch16_224", "--model-arg",
                       "patch_size=32", "--model-arg", "depth=2", "--model-arg", "embed_dim=96", "--model-arg",
                       "num_heads=4",
                       "--data", "imagefolder", "--data-path", str(data), "--batch-size", "32",
                       "--steps", str(args.steps * 2), "--train-images", "512", "--eval-images", "0")
        rows = [(row["workers"], row["samples_per_s"], row["data_share"]) for row in result["rows"]]
        rows_by_round.append(rows)
        print(f"round {r + 1}: " + ", ".join(f"{w} worker(s) {ips:.1f} samples/s, data {share:.1%}"
                                            for w, ips, share in rows), flush=True)
    for i, (w, *_rest) in enumerate(rows_by_round[0]):
        ips = statistics.median(rows[i][1] for rows in rows_by_round)
        share = statistics.median(rows[i][2] for rows in rows_by_round)
        base = statistics.median(rows[0][1] for rows in rows_by_round)
        print(f"loader workers {w}: {ips:.1f} samples/s (x{ips / base:.2f} of 0), data share {share:.1%} "
              f"(medians of {args.rounds})")
    return {"rounds": rows_by_round}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--save", default=None, help="write the figures to this JSON file")
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), rounds=1, depth=2, steps=2)
    with cluster("local", 1) as hosts:
        pictl = Pictl()
        data = write_digits(Path(tempfile.mkdtemp(prefix="pictl-digits-")))
        result = {"checkpointing": checkpointing(pictl, hosts, args),
                  "workers": loader_workers(pictl, hosts, args, data)}
    if args.save:
        print(f"saved: {save_result(args.save, result)}")


if __name__ == "__main__":
    main()
