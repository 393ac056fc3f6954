"""Any model, `equal` against `balanced`, on a fast and a slow link: CNNs and ViTs as 4-stage pipelines.

    sudo .venv/bin/python -m bench.models [--cpu 0.4] [--links 1000,100] [--models resnet50,mobilenetv2_100,...]
                                          [--images 8] [--repeats 2] [--rounds 1] [--save NAME]
    .venv/bin/python -m bench.models --quick     (local cluster, 2 stages, resnet18 and mobilenetv2_100, 4 images)

The 4-host SSH test cluster, every host at --cpu cores (a CFS quota) and every host's sends capped at each
--links rate in turn (Mbit/s; a token bucket on its interface). For each rate and model, in turn: `pictl run
--policy equal` and `pictl run` (balanced, refined during the run), 4 stages, chunk 1, one thread per rank;
the order of the two alternates from model to model (and from round to round, with --rounds). Each model's
speedups divide by its one serial run (measured by its first run, reused by the others: the serial run crosses no
link). With several rounds, each model's balanced / equal ratio is printed per round, with its median and
spread: one round cannot tell a few per cent from the machine's noise. Printed per run: img/s,
speedup, the waterfall's dominant term, the split, and the MB per image that crossed each cut (what the
last stage of each link sent over the timed passes, per image). The link cache is emptied as the rate changes:
pictl trusts a measured link for a minute (`LINK_MAX_AGE_S`), and the bench changes every link under it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from bench.harness import (
    Pictl,
    add_quick,
    alternate,
    flags,
    is_root,
    median_spread,
    quick_defaults,
    save_result,
    skip_loudly,
    ssh_cluster,
    write_local_cluster,
)


def run(pictl: Pictl, inventory: Path, model: str, stages: int, policy: str, args: argparse.Namespace) -> dict:
    # (10: SUSPECT, a flag said why; the figures are still reported)
    return pictl.run(inventory, "--model", model, "--stages", str(stages), "--images", str(args.images), "--chunk",
                     "1", "--warmup", "1", "--repeats", str(args.repeats), "--threads", "1", "--policy", policy,
                     ok=(0, 10))


def row(model: str, link: str, policy: str, s: dict, images_timed: int) -> dict[str, Any]:
    links = (s.get("wire") or {}).get("links", [])
    waterfall = s.get("waterfall") or {}
    return {"model": model, "link": link, "policy": policy, "ips": s["throughput_ips"], "speedup": s["speedup"],
            "serial_ips": s["serial_ips"], "dominant": waterfall.get("dominant"), "split": s["split_points"],
            "mb_per_image": [round((k["wire_bytes"] or 0) / images_timed / 1e6, 3) for k in links],
            "verdict": s.get("verdict"), "flags": flags(s)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=float, default=0.4)
    ap.add_argument("--links", default="1000,100", help="link rates in Mbit/s, comma-separated")
    ap.add_argument("--models", default="resnet50,mobilenetv2_100,vgg16,vit_base_patch16_224")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="each model's pair of runs, this many times in turn")
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), models="resnet18,mobilenetv2_100", stages=2, images=4, repeats=1,
                          links="")
    models = args.models.split(",")
    rates = [float(r) for r in args.links.split(",") if r]
    pictl = Pictl()
    rows: list[dict[str, Any]] = []

    def measure(inventory: Path, link: str) -> None:
        for r in range(args.rounds):
            for k, model in enumerate(models):
                for policy in alternate(("equal", "balanced"), k + r):
                    s = run(pictl, inventory, model, args.stages, policy, args)
                    rows.append({**row(model, link, policy, s, args.images * args.repeats), "round": r})
                    print(_line(rows[-1]), flush=True)

    print(f"{'model':>22} {'link':>9} {'policy':>8} {'img/s':>6} {'speedup':>7} {'dominant':>14}  MB/image per cut  "
          f"split", flush=True)
    if args.quick:
        with_local = pictl.workdir / "cluster"
        measure(write_local_cluster(with_local, args.stages), "local")
    else:
        if not is_root():
            return skip_loudly("models", "needs root for the SSH test cluster (sudo)")
        with ssh_cluster(4, cpu=args.cpu) as cluster:
            for rate in rates:
                cluster.shape_links(rate)
                # pictl trusts a measured link for LINK_MAX_AGE_S; the bench has just changed every link under it.
                shutil.rmtree(Path(pictl.env["PICTL_CACHE_DIR"]) / "links", ignore_errors=True)
                measure(cluster.inventory, f"{rate:g} Mbit")
            cluster.shape_links(None)
    for model in models:
        for link in dict.fromkeys(r["link"] for r in rows):
            ratios = []
            for r in range(args.rounds):
                pair = {x["policy"]: x for x in rows if x["model"] == model and x["link"] == link and x["round"] == r}
                if {"equal", "balanced"} <= set(pair):
                    ratios.append(pair["balanced"]["speedup"] / pair["equal"]["speedup"])
            if ratios:
                mid, spread = median_spread(ratios)
                print(f"{model} at {link}: balanced {mid:.3f}x equal (median of {len(ratios)} round(s): "
                      f"{', '.join(f'{x:.3f}' for x in ratios)}; spread {spread:.1%})")
    if args.save:
        print(f"saved: {save_result(args.save, {'args': vars(args), 'rows': rows})}")
    return 0


def _line(r: dict[str, Any]) -> str:
    mb = " / ".join(f"{v:.2f}" for v in r["mb_per_image"]) or "-"
    return (f"{r['model']:>22} {r['link']:>9} {r['policy']:>8} {r['ips']:6.2f} {r['speedup']:6.2f}x "
            f"{r['dominant'] or '-':>14}  {mb}  {', '.join(r['split'])}")


if __name__ == "__main__":
    raise SystemExit(main())
