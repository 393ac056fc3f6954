"""Int8 numerics for a stage, measured before they are built in (`pictl tune`'s bounded-loss side): torch's
eager dynamic quantization (`torch.ao.quantization.quantize_dynamic`, which torch now points to torchao)
against torchao's int8 dynamic-activation / int8-weight (`Int8DynamicActivationInt8WeightConfig`), each
beside the fp32 model, in interleaved rounds on this machine's CPU.

    .venv/bin/python -m bench.int8 [--model deit_small_patch16_224] [--rounds 4] [--images 16] [--threads 1] [--quick]

Prints per variant: img/s at batch 1 (median of the rounds, and the range), the ratio to fp32, the largest
logit difference from fp32 and top-1 agreement with fp32 on --images synthetic images (random weights:
nearly tied logits, so agreement here understates a trained model's). torchao is not a dependency of
pictl: the script measures it when it is installed (`pip install torchao`) and says so when it is not.
`--quick`: 2 images, 1 round.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import timm
import torch

from bench.harness import add_quick, quick_defaults


def variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    out = {"fp32": model}
    out["torch.ao dynamic int8"] = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        print("torchao: not installed here (pip install torchao), left out")
    else:
        q = copy.deepcopy(model)
        quantize_(q, Int8DynamicActivationInt8WeightConfig())
        out["torchao int8 dyn-act/int8-weight"] = q
    return out


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="deit_small_patch16_224")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=2, rounds=1)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval()
    images = torch.randn(args.images, 3, 224, 224)
    models = variants(model)
    reference = torch.cat([model(x[None]) for x in images])
    for name, m in models.items():  # warm-up, and the outputs against fp32
        out = torch.cat([m(x[None]) for x in images])
        diff = (out - reference).abs().max().item()
        agree = (out.argmax(1) == reference.argmax(1)).float().mean().item()
        print(f"{name:34s} max |logit diff| {diff:.4f}, top-1 agreement with fp32 {agree:.3f}", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))  # a drift cancels between orders
        for name in order:
            start = time.perf_counter()
            for x in images:
                models[name](x[None])
            rates[name].append(args.images / (time.perf_counter() - start))
    base = statistics.median(rates["fp32"])
    print(f"{args.model}, batch 1, {args.threads} thread(s), {args.images} images x {args.rounds} interleaved rounds "
          f"(torch {torch.__version__}, engine {torch.backends.quantized.engine}):")
    for name, xs in rates.items():
        mid = statistics.median(xs)
        print(f"  {name:34s} {mid:6.2f} img/s ({min(xs):.2f}-{max(xs):.2f}), x{mid / base:.2f} of fp32")


if __name__ == "__main__":
    main()
