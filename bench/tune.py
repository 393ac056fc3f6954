"""What `pictl tune` finds on a cluster: the best exact configuration beside the best pipeline-only one, and with
--allow-loss the best within a top-1 agreement bound, each against the fp32 serial run measured in the same tune.

    sudo .venv/bin/python -m bench.tune [--cluster ssh] [--cpu 0.4] [--images 96] [--repeats 2] [--measure 4]
                                        [--max-rounds 9] [--allow-loss] [--trained] [--epochs 8] [--quick]

DeiT-S, chunk 1 (the lab's protocol). The exact tune runs seeded random weights on `--images` synthetic
images (outputs are checked bit for bit, so the weights do not matter there). `--trained` first trains a
DeiT-S (the real architecture at 224 px) with `pictl train --mode single` on scikit-learn's bundled digits,
upscaled (1437 training images; cached under the bench's cache directory, so later calls reuse it), and the
lossy tune runs it on the 360 held-out digits (`--lossy-repeats` timed passes): agreement and accuracy then
describe a model whose logits are not nearly tied, as random weights' are. Prints each tune's ranked table
and one line per finding; saves the tunes' JSON under bench/results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import add_quick, cluster, describe, is_root, quick_defaults, save_result, skip_loudly

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PICTL_BENCH_CACHE", Path.home() / ".cache" / "pictl-bench"))


def pictl(env: dict, *args: str, timeout: float = 7200) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pictl", *args, "--json"], env=env, cwd=env["PICTL_BENCH_CWD"],
                          capture_output=True, text=True, timeout=timeout)
    print(proc.stderr[-6000:] if proc.returncode else _table(proc.stderr), file=sys.stderr, flush=True)
    if proc.returncode not in (0, 3) or not proc.stdout.strip():  # 3: no candidate kept (the JSON says why)
        raise SystemExit(f"pictl {' '.join(args[:2])} failed ({proc.returncode})")
    return json.loads(proc.stdout)


def _table(err: str) -> str:
    return "\n".join(line for line in err.splitlines() if line.startswith("|") or line.startswith("winner"))


def trained_deit(env: dict, epochs: int, lr: float) -> tuple[str, Path, int]:
    """A DeiT-S trained on upscaled digits (cached), its held-out images' directory, their count."""
    from tests.support.digits import write_digits

    data = CACHE / "digits"
    if not (data / "test").is_dir():
        write_digits(data)
    held_out = sum(1 for _ in (data / "test").rglob("*.png"))
    made = CACHE / f"deit-s-digits-{epochs}ep-lr{lr:g}.json"
    if made.is_file() and Path(json.loads(made.read_text())["model"]).is_file():
        return json.loads(made.read_text())["model"], data / "test", held_out
    train_images = sum(1 for _ in (data / "train").rglob("*.png"))
    job = pictl(env, "train", "--mode", "single", "--model", "deit_small_patch16_224", "--num-classes", "10",
                "--data", "imagefolder", "--data-path", str(data), "--train-images", str(train_images),
                "--eval-images", str(held_out), "--epochs", str(epochs), "--steps", "0", "--batch-size", "32",
                "--chunks", "1", "--optimizer", "adamw", "--lr", str(lr), "--threads", "2", "--check-steps", "0",
                "--out", str(CACHE / "jobs"))
    model = job["checkpoint"]["path"]
    made.write_text(json.dumps({"model": model, "top1": job["top1"], "epochs": epochs, "lr": lr}))
    print(f"trained DeiT-S on {train_images} digits (224 px), {epochs} epoch(s): held-out top-1 {job['top1']:.3f}",
          flush=True)
    return model, data / "test", held_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="ssh", choices=("ssh", "local", "shipped"))
    ap.add_argument("--cpu", type=float, default=0.4, help="cores per SSH host")
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--measure", type=int, default=4)
    ap.add_argument("--budget", type=float, default=3600)
    ap.add_argument("--max-rounds", type=int, default=9, help="the tune's rounds at most (3: a fixed count)")
    ap.add_argument("--allow-loss", action="store_true")
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True, help="run the exact tune")
    ap.add_argument("--trained", action="store_true", help="tune a DeiT-S trained on digits (lossy tune)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--lossy-repeats", type=int, default=1)
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=16, repeats=1, measure=2, max_rounds=3)
    if args.cluster == "ssh" and not is_root():
        return skip_loudly("tune", "--cluster ssh needs root (the SSH test cluster; --cluster local does not)")
    work = Path(tempfile.mkdtemp(prefix="pictl-bench-tune-"))
    env = {**os.environ, "PICTL_RUNS_DIR": str(work / "runs"), "PICTL_CACHE_DIR": str(work / "cache"),
           "PICTL_BENCH_CWD": str(work)}
    found: dict = {}
    common = ["--chunk", "1", "--warmup", "1", "--repeats", str(args.repeats), "--measure", str(args.measure),
              "--budget", str(args.budget), "--max-rounds", str(args.max_rounds)]
    lossy = ["--images", str(args.images)]
    if args.trained:
        model, cached, held_out = trained_deit({**env, "PICTL_BENCH_CWD": str(ROOT)}, args.epochs, args.lr)
        # The SSH hosts are logins of their own: they read the images where anyone may, not in root's cache.
        work.chmod(0o755)
        data = Path(shutil.copytree(cached, work / "held-out"))
        lossy = ["--model", model, "--data", "imagefolder", "--data-path", str(data),
                 "--images", str(held_out - held_out % 4)]  # dealt evenly among up to 4 replicas
    with cluster(args.cluster, 4, cpu=args.cpu) as inventory:
        if args.exact:
            found["exact"] = pictl(env, "tune", "--hosts", str(inventory), "--images", str(args.images), *common,
                                   "--out", str(work / "exact"), "--save-as", "tuned-exact")
        if args.allow_loss:
            found["lossy"] = pictl(env, "tune", "--hosts", str(inventory), *lossy, *common,
                                   "--repeats", str(args.lossy_repeats), "--allow-loss", "--min-agreement", "0.99",
                                   "--out", str(work / "lossy"), "--save-as", "tuned-lossy")
    print(f"\nDeiT-S, chunk 1, on {describe(args.cluster, args.cpu)}; exact: random weights, {args.images} images x "
          f"{args.repeats} timed passes; lossy: " + (f"trained on digits, every held-out image x {args.lossy_repeats}"
                                                      if args.trained else "random weights") + ":")
    for kind, tune in found.items():
        for key in ("winner", "best_exact", "best_pipeline"):
            row = tune.get(key)
            if row:
                print(f"  {kind} tune, {key}: {row['candidate']}: {row['throughput_ips']} img/s, "
                      f"{row['speedup_vs_fp32']}x the fp32 serial run, agreement {row['agreement_vs_fp32']}")
    save_result(args.save or "tune", {"args": vars(args), "tunes": found})
    return 0


if __name__ == "__main__":
    sys.exit(main())
