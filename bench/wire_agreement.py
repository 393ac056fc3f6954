"""What each `--wire` format does to a trained model's answers: top-1 agreement and accuracy per format.

    .venv/bin/python -m bench.wire_agreement [--hosts hosts.toml] [--formats fp16,bf16,int8,lowrank:8]
                                             [--epochs 30] [--out bench-wire-agreement] [--quick]

`bench/wire.py` measures throughput on DeiT-S with seeded random weights, whose
logits are nearly tied (a random model barely prefers one class), so the top-1
agreement it prints says more about the ties than about the format. No trained
DeiT-S is available offline, so this script makes a trained model that is: it
writes scikit-learn's bundled handwritten digits (1797 real 8x8 images, 10
classes) as an ImageFolder, trains a 12-block ViT on them with `pictl train
--mode single` (32 px, patch 8, width 96, 4 heads; about two minutes on 2
cores), then runs the trained model as a 4-stage pipeline cut at the block
boundaries bench/wire.py uses (blocks.3, blocks.6, blocks.9) once per format
over every held-out image, against its serial run, on the given cluster (the
shipped local cluster needs no root). Prints per format: agreement with the
serial top-1 over all held-out images, pipeline and serial accuracy, max and
mean |logit difference|, and KB per image on the wire. `--quick`: 1 epoch, fp32 and int8 only, on a local
cluster of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import add_quick, cluster, quick_defaults
from tests.support.digits import write_digits  # scikit-learn's digits as an ImageFolder

ROOT = Path(__file__).resolve().parent.parent

SPLIT = "blocks.3,blocks.6,blocks.9"
VIT = ["img_size=32", "patch_size=8", "depth=12", "embed_dim=96", "num_heads=4"]


def pictl(env: dict, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pictl", *args, "--json"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"pictl {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=Path, default=ROOT / "hosts.toml")
    parser.add_argument("--formats", default="fp16,bf16,int8,lowrank:8")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench-wire-agreement"))
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), epochs=1, formats="int8", out=None)
    tmp = Path(tempfile.mkdtemp(prefix="pictl-bench-agreement-"))
    args.out = args.out or tmp / "out"  # (a quick run's files go to its temporary directory)
    with cluster("local" if args.quick else "shipped", 4, inventory=args.hosts) as hosts:
        return measure(args, hosts, tmp)


def measure(args: argparse.Namespace, hosts: Path, tmp: Path) -> int:
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp / "runs"), "PICTL_CACHE_DIR": str(tmp / "cache")}
    data = write_digits(tmp / "digits")
    held_out = sum(1 for _ in (data / "test").rglob("*.png"))
    train_images = sum(1 for _ in (data / "train").rglob("*.png"))
    job = pictl(env, "train", "--hosts", str(hosts), "--mode", "single", "--model", "vit_tiny_patch16_224",
                *(w for a in VIT for w in ("--model-arg", a)), "--data", "imagefolder", "--data-path", str(data),
                "--train-images", str(train_images), "--eval-images", str(held_out), "--epochs", str(args.epochs),
                "--steps", "0", "--batch-size", "64", "--chunks", "1", "--optimizer", "adamw", "--lr", "0.003",
                "--threads", "2", "--check-steps", "0", "--out", str(tmp / "jobs"))
    model = job["checkpoint"]["path"]
    print(f"trained: ViT ({', '.join(VIT)}) on {train_images} digits, {args.epochs} epochs: held-out top-1 "
          f"{job['top1']:.3f} over {held_out} images ({model})", flush=True)
    rows = {}
    for fmt in ["fp32", *args.formats.split(",")]:
        s = pictl(env, "run", "--hosts", str(hosts), "--model", model, "--stages", "4", "--split", SPLIT,
                  "--data", "imagefolder", "--data-path", str(data / "test"), "--images", str(held_out),
                  "--repeats", "1", "--wire", fmt, "--min-agreement", "0", "--headless")
        link = s["wire"]["links"][0]
        rows[fmt] = {"agreement": s.get("agreement"), "accuracy": s.get("accuracy"),
                     "serial_accuracy": s.get("serial_accuracy"), "outputs_match": s.get("outputs_match"),
                     "max_abs_diff": s.get("max_abs_diff"), "mean_abs_diff": s.get("mean_abs_diff"),
                     "kb_per_image": link["wire_bytes"] / (s["images"] * s["repeats"]) / 1e3}
        print(f"  {fmt}: agreement {rows[fmt]['agreement']}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agreement.json").write_text(json.dumps(rows, indent=1))
    print(f"4 stages at {SPLIT} on {hosts}, all {held_out} held-out images, against the serial run:")
    print(f"{'wire':>10} {'agreement':>10} {'accuracy':>9} {'serial acc':>10} {'max |diff|':>10} {'mean |diff|':>11} "
          f"{'KB/img':>7}")
    for fmt, r in rows.items():
        agree = "exact" if r["agreement"] is None and r["outputs_match"] else f"{r['agreement']:.4f}"
        print(f"{fmt:>10} {agree:>10} {r['accuracy']:9.4f} {r['serial_accuracy']:10.4f} {r['max_abs_diff']:10.4f} "
              f"{r['mean_abs_diff'] or 0:11.5f} {r['kb_per_image']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
