"""Structured pruning of a timm ViT/DeiT with torch-pruning, fine-tuning, and the artifact.

    python -m remote.pruning.prune --spec SPEC.json

Runs on the controller or on a host (`pictl prune --on HOST`). Emits `prune_*`
events (one JSON object per line, like a run) and writes one `.safetensors`
artifact (`remote.toolkit.artifact`) under a temporary name, renamed when complete.

Two things the upstream timm example gets wrong on timm 1.0.x are handled here:
timm's own `Attention.forward` is kept (no override; it takes `attn_mask` and has
a `norm`), and after pruning each attention layer's `head_dim`, `attn_dim` and
`scale` are set from its new qkv width.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn

from remote.data.datasets import labelled_set
from remote.floor import protocol as P
from remote.floor.artifact_meta import ArtifactMeta
from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.job_records import PruneAccuracy, PruneDone, PruneProgress, PruneStart
from remote.floor.spec import IMPORTANCES, OPTIMIZERS, PruneSpec
from remote.pruning.finetune import finetune, loader, top1
from remote.toolkit.artifact import attention_heads, pruned_widths, save_artifact, set_attention_widths
from remote.toolkit.model import Checkpoint, create_meta_model, materialize
from remote.toolkit.pieces import check_supported


def validate(spec: PruneSpec) -> None:
    """Every field a person typed, checked before any data or model is touched."""
    if not 0 < spec.ratio < 1:
        raise BadInput(f"ratio {spec.ratio}: must be between 0 and 1 (exclusive)")
    if spec.importance not in IMPORTANCES:
        raise BadInput(f"importance '{spec.importance}': use one of {', '.join(IMPORTANCES)}")
    if spec.optimizer not in OPTIMIZERS:
        raise BadInput(f"optimizer '{spec.optimizer}': use one of {', '.join(OPTIMIZERS)}")
    for name in ("epochs", "train_images", "eval_images", "threads"):
        if getattr(spec, name) < 0:
            raise BadInput(f"{name.replace('_', '-')} {getattr(spec, name)}: must not be negative")
    for name in ("batch_size", "calib_batches", "round_to"):
        if getattr(spec, name) < 1:
            raise BadInput(f"{name.replace('_', '-')} {getattr(spec, name)}: must be at least 1")
    if spec.lr <= 0:
        raise BadInput(f"lr {spec.lr}: must be positive")
    if spec.device not in ("auto", "cpu", "cuda"):
        raise BadInput(f"device '{spec.device}': use auto, cpu or cuda")
    if not spec.out.endswith(".safetensors"):
        raise BadInput(f"out {spec.out}: an artifact is a .safetensors file")


def pick_device(spec: PruneSpec) -> torch.device:
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("device cuda: this machine has no usable CUDA device")
    return torch.device("cuda" if spec.device != "cpu" and torch.cuda.is_available() else "cpu")


def importance(name: str):  # noqa: ANN201 - a torch_pruning Importance
    import torch_pruning as tp

    class Hessian(tp.importance.GroupHessianImportance):
        # torch-pruning 1.6.1 tests `name not in` a dict keyed by parameters, so every
        # sample overwrites the last one's squared gradient; accumulate them all.
        def accumulate_grad(self, model: nn.Module) -> None:
            for p in model.parameters():
                if p.grad is not None:
                    g2 = p.grad.detach().pow(2)
                    self._accu_grad[p] = self._accu_grad[p] + g2 if p in self._accu_grad else g2.clone()
                    self._counter[p] = self._counter.get(p, 0) + 1

    return {"l1": lambda: tp.importance.GroupMagnitudeImportance(p=1),
            "l2": lambda: tp.importance.GroupMagnitudeImportance(p=2),
            "taylor": tp.importance.GroupTaylorImportance,
            "hessian": Hessian}[name]()


def calibrate(model: nn.Module, imp, name: str, batches, device: torch.device) -> int:  # noqa: ANN001
    """Gradients for the gradient-based importances: taylor sums them, hessian squares per sample."""
    if name not in ("taylor", "hessian"):
        return 0
    model.eval()  # dropout off: scores should not depend on which units happened to drop
    model.zero_grad(set_to_none=True)
    seen = 0
    for images, labels in batches:
        logits = model(images.to(device))
        if name == "taylor":
            F.cross_entropy(logits, labels.to(device)).backward()
        else:
            for loss in F.cross_entropy(logits, labels.to(device), reduction="none"):
                model.zero_grad(set_to_none=True)
                loss.backward(retain_graph=True)
                imp.accumulate_grad(model)
        seen += len(labels)
    return seen


def build_pruner(model: nn.Module, spec: PruneSpec, example: torch.Tensor, imp):  # noqa: ANN001, ANN201
    import torch_pruning as tp

    extra = {p: p.dim() - 1 for p in (getattr(model, n, None) for n in ("cls_token", "reg_token", "pos_embed"))
             if isinstance(p, nn.Parameter)}
    qkv_heads = {m.qkv: m.num_heads for _, m in model.named_modules() if hasattr(m, "qkv") and hasattr(m, "num_heads")}
    return tp.pruner.BasePruner(
        model, example, importance=imp, pruning_ratio=spec.ratio, global_pruning=spec.global_pruning,
        ignored_layers=[model.get_classifier()],  # the classifier keeps its classes
        num_heads=qkv_heads, prune_num_heads=spec.prune_heads, prune_head_dims=not spec.prune_heads,
        head_pruning_ratio=spec.ratio if spec.prune_heads else 0.0, round_to=spec.round_to,
        unwrapped_parameters=list(extra.items()))  # a list of (param, dim), whatever the hint says


def count_macs(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(model, example)
    return int(macs), int(params)


def prune_model(model: nn.Module, spec: PruneSpec, example: torch.Tensor, calib: list, device: torch.device,
                ) -> tuple[int, int]:
    """Prune `model` in place by `spec`'s importance and ratio; returns its (MACs, parameters) after."""
    imp = importance(spec.importance)
    pruner = build_pruner(model, spec, example, imp)
    calibrate(model, imp, spec.importance, calib, device)
    pruner.step()
    model.zero_grad(set_to_none=True)
    # The pruner counts removed heads in its own table, not on the modules: without this, a qkv
    # that lost whole heads would be read as every head narrowed (same shapes, wrong attention).
    heads = {name: int(pruner.num_heads.get(model.get_submodule(name).qkv, count))
             for name, count in attention_heads(model).items()}
    set_attention_widths(model, heads)
    return count_macs(model, example)


def _run(spec: PruneSpec, emitter: Emitter) -> None:
    validate(spec)
    device = pick_device(spec)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    meta_model = create_meta_model(spec.model, spec.num_classes or 1000, **spec.model_kwargs)
    check_supported(meta_model, spec.model)  # the pruner's rules cover timm's plain ViT blocks
    cfg = meta_model.pretrained_cfg
    train_set = labelled_set(spec.data, "train", cfg, limit=spec.train_images, seed=spec.seed)
    test_set = labelled_set(spec.data, "test", cfg, limit=spec.eval_images, seed=spec.seed + 1)
    classes = spec.num_classes or train_set.num_classes
    if classes != meta_model.num_classes:
        meta_model = create_meta_model(spec.model, classes, **spec.model_kwargs)
    checkpoint = Checkpoint(spec.checkpoint) if spec.checkpoint else None
    model = materialize(meta_model, seed=spec.seed, checkpoint=checkpoint).to(device)
    example = torch.randn((1, *cfg["input_size"]), device=device)
    macs_base, params_base = count_macs(model, example)
    emitter.emit(PruneStart(model=spec.model, device=str(device), params=params_base, macs=macs_base,
                 train_images=len(train_set), eval_images=len(test_set), classes=classes, ratio=spec.ratio,
                 importance=spec.importance, torch=torch.__version__))
    train = loader(train_set, spec.batch_size, shuffle=True, seed=spec.seed)
    test = loader(test_set, spec.batch_size, shuffle=False)
    accuracy: dict = {"before": top1(model, test, device)}
    emitter.emit(PruneAccuracy(phase="before", epoch=None, top1=accuracy["before"]))

    calib = [b for _, b in zip(range(spec.calib_batches), train, strict=False)]
    macs, params = prune_model(model, spec, example, calib, device)
    accuracy["pruned"] = top1(model, test, device)
    emitter.emit(PruneAccuracy(phase="pruned", epoch=None, top1=accuracy["pruned"], params=params, macs=macs,
                 widths=pruned_widths(model)))

    accuracy["epochs"] = []

    def on_epoch(epoch: int, acc: float, seconds: float) -> None:
        accuracy["epochs"].append(acc)
        emitter.emit(PruneAccuracy(phase="epoch", epoch=epoch, top1=acc, seconds=round(seconds, 2)))

    def on_progress(epoch: int, step: int, steps: int, loss: float, ips: float) -> None:
        emitter.emit(PruneProgress(epoch=epoch, epochs=spec.epochs, step=step, steps=steps,
                     loss=round(loss, 5), ips=round(ips, 2)))

    best, best_epoch = finetune(model, train, test, spec, device, start_top1=accuracy["pruned"],
                                on_progress=on_progress, on_epoch=on_epoch)
    accuracy.update(best=best, best_epoch=best_epoch)
    model = model.cpu().eval()
    meta = ArtifactMeta(
        base_model=spec.model, num_classes=classes, heads=attention_heads(model), model_kwargs=spec.model_kwargs,
        ratio=spec.ratio, importance=spec.importance, global_pruning=spec.global_pruning,
        prune_heads=spec.prune_heads, params_base=params_base, params=params, macs_base=macs_base, macs=macs,
        dataset=f"{spec.data.kind}:{spec.data.path}", accuracy=accuracy, widths=pruned_widths(model),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    path = save_artifact(model, meta, spec.out)
    emitter.emit(PruneDone(artifact=str(path.resolve()), meta=asdict(meta)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_PRUNE)
    from remote.toolkit.measure import run_main

    return run_main(emitter, lambda: _run(PruneSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
