"""Pipeline training over a compressed link: the two-machine experiment's table, on data pictl can have offline.

    sudo .venv/bin/python -m bench.train_wire [--mbit 100] [--cpu 1.0] [--chunks 1,4,8] [--split blocks.2]
                         [--wires fp32,fp16,bf16,int8,lowrank:4,lowrank:2,convinsert:0.25] [--epochs 2]
                         [--no-feedback-too] [--quick]

MobileNetV2 (timm's mobilenetv2_100 at 32 px) fine-tuned as a 2-stage GPipe pipeline on scikit-learn's digits
(written as an ImageFolder: real images, a real held-out split), over 2 hosts of the SSH test cluster with
every host's sending capped at --mbit (a token bucket on its eth0) and its CPU at --cpu cores. One
`pictl sweep --train` runs every wire format at every chunk count; printed per (format, chunks): held-out
top-1, average and peak bandwidth on the link (bytes sent or received over the sender's computation time:
the mean step and the best one), computation time per batch and time per batch, as the source reports them.
lowrank runs with error feedback (the default); --no-feedback-too runs its formats again without it
(rows marked `lowrank:R -ef`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench.harness import Pictl, add_quick, is_root, quick_defaults, save_result, skip_loudly, ssh_cluster
from tests.support.digits import write_digits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbit", type=float, default=100.0)
    ap.add_argument("--cpu", type=float, default=1.0)
    ap.add_argument("--chunks", default="1,4,8")
    ap.add_argument("--wires", default="fp32,fp16,bf16,int8,lowrank:4,lowrank:2,convinsert:0.25")
    ap.add_argument("--no-feedback-too", action="store_true", help="lowrank formats again, without error feedback")
    ap.add_argument("--split", default="blocks.2", help="the cut (blocks.2 at 32 px: a 24 x 8 x 8 feature map)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), chunks="1,4", wires="fp32,fp16", epochs=1)
    if not is_root():
        return skip_loudly("bench/train_wire.py", "needs root for the SSH test cluster (sudo)")
    data = Path(tempfile.mkdtemp(prefix="pictl-digits-"))
    write_digits(data)
    for path in [data, *data.rglob("*")]:  # the hosts' logins are other users
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    with ssh_cluster(4, cpu=args.cpu) as cluster:
        cluster.shape_links(args.mbit)
        pictl = Pictl()
        common = ["--hosts", str(cluster.inventory), "--modes", "pipeline", "--schedules", "gpipe", "--stages", "2",
                  "--split", args.split, "--chunks", args.chunks, "--model", "mobilenetv2_100", "--image-size", "32",
                  "--data", "imagefolder", "--data-path", str(data), "--batch-size", str(args.batch_size), "--steps",
                  str(args.epochs * 1408 // args.batch_size), "--train-images", "1408", "--eval-images", "352"]
        result = pictl("sweep", "--train", "--out", str(pictl.workdir / "sweep"), "--wire", args.wires, *common,
                       timeout=7200)
        lowrank = ",".join(w for w in args.wires.split(",") if w.startswith("lowrank"))
        if args.no_feedback_too and lowrank:
            plain = pictl("sweep", "--train", "--out", str(pictl.workdir / "sweep-no-feedback"), "--wire", lowrank,
                          "--no-error-feedback", *common, timeout=7200)
            result["rows"] += [{**r, "wire": f"{r['wire']} -ef"} for r in plain["rows"]]
    print(f"2-stage pipeline training, MobileNetV2 on digits at 32 px, batch {args.batch_size}, {args.epochs} "
          f"epoch(s), links {args.mbit:g} Mbit/s, {args.cpu:g} core(s) per host")
    print(f"{'wire':>14} {'chunks':>6} {'top-1':>6} {'avg MB/s':>9} {'peak MB/s':>9} {'compute ms':>10} "
          f"{'batch ms':>9} {'loss check':>22}")
    for r in result["rows"]:
        print(f"{r['wire']:>14} {r['chunks']:>6} {r['top1'] or 0:>6.3f} {r['avg_MBps'] or 0:>9.2f} "
              f"{r['peak_MBps'] or 0:>9.2f} {r['compute_ms'] or 0:>10.1f} {r['step_ms'] or 0:>9.1f} "
              f"{r['loss_agreement'] or '-':>22}")
    if args.save:
        print(f"saved: {save_result(args.save, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
