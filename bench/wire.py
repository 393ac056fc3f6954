"""What activation compression buys on slow links: throughput per `--wire` format against link rate.

    sudo .venv/bin/python -m bench.wire [--rates 1000,100,50,20] [--formats fp32,fp16,int8,lowrank:8]
                                        [--cpu 0.4] [--images 48] [--repeats 2] [--out bench-wire] [--quick]

Starts the 4-host SSH test cluster (root: network namespaces, sshd, cgroups; each host capped at --cpu
cores), then for each link rate caps what every host sends (`tc` token bucket on its eth0) and runs, in
turn, one 4-stage `pictl run` per format at the same block-boundary split (blocks.3, blocks.6, blocks.9),
all against one serial baseline. Lossy formats run with `--min-agreement 0` so that every figure is kept;
their top-1 agreement with the serial run over every image is printed beside them. Prints one row per
(rate, format): img/s (spread of the timed passes), ratio to fp32 at that rate, agreement, KB per image
on each link, compress and decompress ms per image; writes a plot of throughput against link rate per
format with the rate below which fp32 is wire-bound marked. `--quick`: fp32 and int8 at 100 Mbit/s, 8 images,
1 timed pass (root too; without it, skipped with a loud line).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import add_quick, is_root, quick_defaults, skip_loudly, ssh_cluster

SPLIT = "blocks.3,blocks.6,blocks.9"


def pictl_run(inventory: Path, env: dict, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pictl", "run", "--hosts", str(inventory), "--threads", "1",
                           "--headless", "--json", *args], env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"pictl run {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def row_of(s: dict) -> dict:
    links = s["wire"]["links"]
    images = s["images"] * s["repeats"]
    return {"ips": s["throughput_ips"], "spread": s["throughput_spread_ips"], "agreement": s.get("agreement"),
            "kb_per_image": links[0]["wire_bytes"] / images / 1e3,
            "compress_ms": sum(k["compress_s"] or 0 for k in links) / images * 1e3,
            "decompress_ms": sum(k["decompress_s"] or 0 for k in links) / images * 1e3,
            "serial": s["serial_ips"], "flags": [f["code"] for f in s.get("flags") or []]}


def plot(results: dict[tuple[float, str], dict], rates: list[float], formats: list[str], bound: float | None,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fmt in formats:
        ax.plot(rates, [results[(r, fmt)]["ips"] for r in rates], "o-", label=fmt)
    if bound is not None:
        ax.axvline(bound, color="grey", linestyle=":", label=f"fp32 wire-bound at {bound:g} Mbit/s and below")
    ax.set_xscale("log")
    ax.set_xlabel("link rate per host (Mbit/s)")
    ax.set_ylabel("pipeline images / s (4 stages)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1000,100,50,20", help="Mbit/s per host, comma-separated")
    parser.add_argument("--formats", default="fp32,fp16,int8,lowrank:8")
    parser.add_argument("--cpu", type=float, default=0.4)
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-wire"))
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), rates="100", formats="fp32,int8", images=8, repeats=1,
                          out=None)  # (a quick run's files go to its temporary directory)
    if not is_root():
        return skip_loudly("wire", "needs root for the SSH test cluster and its shaped links (sudo)")
    rates = [float(r) for r in args.rates.split(",")]
    formats = args.formats.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="pictl-bench-wire-"))
    args.out = args.out or tmp / "out"
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp / "runs"), "PICTL_CACHE_DIR": str(tmp / "cache")}
    protocol = ["--images", str(args.images), "--warmup", "1", "--repeats", str(args.repeats)]
    results: dict[tuple[float, str], dict] = {}
    with ssh_cluster(4, cpu=args.cpu) as cluster:
        inventory = cluster.inventory
        serial = pictl_run(inventory, env, "--stages", "1", *protocol)
        for rate in rates:
            cluster.shape_links(rate)
            for fmt in formats:  # in turn at one rate: the same machine, minutes apart
                s = pictl_run(inventory, env, "--stages", "4", "--split", SPLIT, "--wire", fmt, "--min-agreement",
                              "0", *protocol)
                results[(rate, fmt)] = row_of(s)
                print(f"  {rate:g} Mbit/s {fmt}: {s['throughput_ips']:.2f} img/s", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wire.json").write_text(json.dumps({f"{r:g} {f}": v for (r, f), v in results.items()}, indent=1))
    fp32_fast = results[(max(rates), "fp32")]["ips"]
    kb = results[(max(rates), "fp32")]["kb_per_image"]
    # Wire-bound, as measured: the fastest link at which fp32 falls more than 5 % under its fastest-link figure
    # (the nominal rate over the bytes per image overstates what TCP through a token bucket delivers).
    slowed = [r for r in rates if results[(r, "fp32")]["ips"] < 0.95 * fp32_fast] if "fp32" in formats else []
    bound = max(slowed) if slowed else None
    print(f"4 stages at {SPLIT} on the SSH test cluster ({args.cpu} core per host), {args.images} images, chunk 1, "
          f"1 warm-up + {args.repeats} timed passes; serial {serial['throughput_ips']:.2f} img/s; fp32 sends "
          f"{kb:.0f} KB per image per link; wire-bound (under 0.95 of its {max(rates):g} Mbit/s figure) at "
          f"{'none of the rates' if bound is None else f'{bound:g} Mbit/s and below'}")
    print(f"{'Mbit/s':>7} {'wire':>10} {'img/s':>7} {'spread':>13} {'x fp32':>7} {'agree':>6} {'KB/img':>7} "
          f"{'comp ms':>7} {'dec ms':>6}  flags")
    for rate in rates:
        base = results[(rate, "fp32")]["ips"] if "fp32" in formats else None
        for fmt in formats:
            r = results[(rate, fmt)]
            agree = "exact" if r["agreement"] is None else f"{r['agreement']:.3f}"
            ratio = f"{r['ips'] / base:6.2f}x" if base else "-"
            print(f"{rate:7g} {fmt:>10} {r['ips']:7.2f} {min(r['spread']):6.2f}-{max(r['spread']):<6.2f} {ratio:>7} "
                  f"{agree:>6} {r['kb_per_image']:7.0f} {r['compress_ms']:7.2f} {r['decompress_ms']:6.2f}  "
                  f"{','.join(c for c in r['flags'] if c != 'fill_drain_bound') or '-'}")
    plot(results, rates, formats, bound, args.out / "throughput_vs_link_rate.png")
    print(f"plot: {args.out / 'throughput_vs_link_rate.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
