"""The numerics' gain and the parallelism's, apart: DeiT-S as an N-stage pipeline in fp32 and in int8-dynamic,
each beside the serial runs it is measured against, in alternating rounds on one cluster.

    sudo .venv/bin/python -m bench.numerics [--cluster ssh] [--cpu 0.4] [--stages 4] [--images 96]
                                            [--repeats 2] [--rounds 2] [--quick]

Each round runs, in alternating order, `pictl run --numerics fp32` and `--numerics int8-dynamic` (chunk 1,
the lab's protocol; the same explicit block split, since `balanced` profiles fp32 pieces), every serial run
measured afresh (`--fresh-baseline`). Printed per round and as medians with their spread: the fp32
pipeline's speedup over the fp32 serial run; the int8 pipeline's over the fp32 serial run (what a lab
would grade) and over the int8 serial run (the parallelism alone); int8's own gain on one host; and int8's
top-1 agreement with fp32 over every image (random weights: nearly tied logits, so this understates a
trained model's agreement; `bench/wire_agreement.py` trains one).
"""

from __future__ import annotations

import argparse

from bench.harness import (
    Pictl,
    add_quick,
    alternate,
    cluster,
    describe,
    is_root,
    median_spread,
    quick_defaults,
    save_result,
    skip_loudly,
)

SPLITS = {2: "blocks.6", 3: "blocks.4,blocks.8", 4: "blocks.3,blocks.6,blocks.9"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="ssh", choices=("ssh", "local", "shipped"))
    ap.add_argument("--cpu", type=float, default=0.4, help="cores per SSH host")
    ap.add_argument("--stages", type=int, default=4, choices=sorted(SPLITS))
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=16, repeats=1, rounds=1)
    if args.cluster == "ssh" and not is_root():
        return skip_loudly("numerics", "--cluster ssh needs root (the SSH test cluster; --cluster local does not)")
    pictl = Pictl()
    rows: list[dict] = []
    with cluster(args.cluster, args.stages, cpu=args.cpu) as inventory:
        for r in range(args.rounds):
            got = {}
            for numerics in alternate(["fp32", "int8-dynamic"], r):
                got[numerics] = pictl.run(inventory, "--stages", str(args.stages), "--split", SPLITS[args.stages],
                                          "--chunk", "1", "--images", str(args.images), "--repeats",
                                          str(args.repeats), "--threads", "1", "--numerics", numerics,
                                          "--fresh-baseline")
            fp32, int8 = got["fp32"], got["int8-dynamic"]
            n = int8["numerics"]
            rows.append({"round": r + 1, "fp32_serial_ips": fp32["serial_ips"],
                         "fp32_pipeline_ips": fp32["throughput_ips"],
                         "fp32_speedup": fp32["speedup"], "int8_serial_ips": int8["serial_ips"],
                         "int8_pipeline_ips": int8["throughput_ips"], "int8_vs_fp32_serial": n["speedup_vs_fp32"],
                         "int8_vs_int8_serial": int8["speedup"], "int8_gain": n["numerics_gain"],
                         "agreement": n["agreement_vs_fp32"], "engines": n["engines"],
                         "outputs_match": [fp32["outputs_match"], int8["outputs_match"]]})
            print(f"round {r + 1}: fp32 {fp32['speedup']:.2f}x; int8 {n['speedup_vs_fp32']:.2f}x over fp32 serial, "
                  f"{int8['speedup']:.2f}x over int8 serial; int8 alone {n['numerics_gain']:.2f}x; agreement "
                  f"{n['agreement_vs_fp32']:.3f}", flush=True)
    print(f"\nDeiT-S, {args.stages} stages at {SPLITS[args.stages]}, chunk 1, {args.images} images x {args.repeats} "
          f"timed passes, {args.rounds} round(s) on {describe(args.cluster, args.cpu)}; engines "
          f"{', '.join(rows[-1]['engines'])}; outputs bit-identical to the same-numerics serial run: "
          f"{all(all(r['outputs_match']) for r in rows)}")
    for key, what in (("fp32_speedup", "fp32 pipeline over fp32 serial"),
                      ("int8_vs_fp32_serial", "int8 pipeline over fp32 serial"),
                      ("int8_vs_int8_serial", "int8 pipeline over int8 serial (parallelism alone)"),
                      ("int8_gain", "int8 serial over fp32 serial (numerics alone)"),
                      ("agreement", "int8 top-1 agreement with fp32")):
        mid, spread = median_spread([row[key] for row in rows])
        print(f"  {what:52s} {mid:6.3f} (spread {spread:.1%})")
    if args.save:
        print(f"saved: {save_result(args.save, rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
