"""The pruning workflow: bad input, a real prune + fine-tune on real images, and DeiT-S per importance.

`pictl prune` runs torch-pruning in a process of its own (`remote.pruning.prune`); its artifact
must load on a host without unpickling and give the same outputs in a pipeline as serially.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from support.cli import finished
from support.clusters import write_cluster
from support.digits import write_digits
from support.typed import untyped

from pictl.job_summaries import PruneSummary

DIGITS_VIT = ["img_size=32", "patch_size=8", "depth=2", "embed_dim=64", "num_heads=4"]
THRESHOLD = 0.85
"""Held-out top-1 on digits that the unpruned small ViT reaches after 20 epochs (0.925 measured at width 64 and
depth 2: 0.95 at width 96 and 0.93 at depth 4, each in twice the time) and that the pruned one (0.68 right after
pruning) must reach again after a short fine-tune of two epochs (0.89 after its first, 0.91 after its second)."""


def _one_error(proc, fragment: str, code: int = 2) -> str:  # noqa: ANN001
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("pictl: error: ")]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-2000:]
    assert fragment in errors[0], errors[0]
    return errors[0]


DEIT = "deit_tiny_patch16_224"


@pytest.mark.parametrize("args, fragment", [
    (["--ratio", "1.5"], "--ratio: must be more than 0 and less than 1 (got 1.5)"),
    (["--ratio", "0"], "--ratio: must be more than 0 and less than 1 (got 0.0)"),
    (["--importance", "magic"], "--importance: must be one of 'l1', 'l2', 'taylor' or 'hessian' (got 'magic')"),
    (["--data-path", ""], "needs data_path"),
    (["--model-arg", "depth"], "--model-arg 'depth': use KEY=VALUE"),
    (["--checkpoint", "/nonexistent/base.safetensors"], "checkpoint /nonexistent/base.safetensors: no such file"),
])
def test_refused_before_anything_starts(args: list[str], fragment: str, pictl_env, pictl_forks, tmp_path: Path) -> None:
    proc = pictl_forks.run(["prune", "--data", "imagefolder", "--data-path", str(tmp_path), *args], pictl_env)
    _one_error(proc, fragment)
    assert not (tmp_path / "prunes").exists(), "a refused job left a job directory"


def _train_base(data: Path, out: Path) -> float:
    """The unpruned small ViT, trained from scratch on the digits: the model the test prunes."""
    import torch
    from safetensors.torch import save_file

    from remote.data.datasets import labelled_set
    from remote.floor.spec import DataSpec, PruneSpec
    from remote.pruning.finetune import finetune, loader
    from remote.toolkit.model import create_meta_model, materialize

    kwargs = {k: int(v) for k, v in (a.split("=") for a in DIGITS_VIT)}
    # One thread, here and in the job (`--threads 1`): two threads on a 2-core machine that another worker
    # or another team loads spin against it (350 s instead of 30 s beside one busy loop).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = PruneSpec(model="vit_tiny_patch16_224", epochs=20, lr=3e-3, optimizer="adamw", batch_size=64,
                     data=DataSpec(kind="imagefolder", path=str(data)))
    torch.manual_seed(0)
    model = materialize(create_meta_model(spec.model, 10, **kwargs), seed=0, checkpoint=None)
    cfg = model.pretrained_cfg
    train = loader(labelled_set(spec.data, "train", cfg), 64, shuffle=True)
    test = loader(labelled_set(spec.data, "test", cfg), 256, shuffle=False)
    best, _ = finetune(model, train, test, spec, torch.device("cpu"), start_top1=0.0,
                       on_progress=lambda *_: None, on_epoch=lambda *_: None)
    torch.set_num_threads(threads)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out))
    return best


@pytest.mark.slow
def test_digits_prune_and_finetune(pictl_env, pictl_forks, tmp_path: Path) -> None:
    data = write_digits(tmp_path / "digits")
    base = tmp_path / "base.safetensors"
    base_top1 = _train_base(data, base)
    print(f"unpruned held-out top-1: {base_top1:.2%}")
    assert base_top1 >= THRESHOLD, f"the unpruned model reaches only {base_top1:.2%}: the threshold means nothing"

    common = ["prune", "--model", "vit_tiny_patch16_224", *sum((["--model-arg", a] for a in DIGITS_VIT), []),
              "--checkpoint", str(base), "--data", "imagefolder", "--threads", "1"]
    env = pictl_forks.with_settings(pictl_env)
    # One calibration batch (64 images, each its own backward pass for the hessian): the default four took a
    # third of the job, and what is asserted is the accuracy the fine-tune wins back, not how finely it was scored.
    # Two epochs: the first is already above the threshold, the second shows the best epoch is the one kept.
    proc = pictl_forks.run([*common, "--data-path", str(data), "--ratio", "0.3", "--importance", "hessian",
                            "--calib-batches", "1", "--epochs", "2", "--optimizer", "adamw", "--lr", "1e-3",
                            "--batch-size", "64", "--json"], env, 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert untyped(PruneSummary.model_validate(summary)) == []  # every key the job wrote is typed
    # Measured on the held-out test/ folder, before, right after, and after fine-tuning.
    assert summary["top1_before"] == pytest.approx(base_top1)
    assert summary["top1_pruned"] < summary["top1_before"], "pruning 30% of every width cost nothing?"
    assert summary["top1"] >= THRESHOLD, summary
    assert summary["top1"] == max(summary["top1_epochs"] + [summary["top1_pruned"]])
    assert summary["params"] < 0.6 * summary["params_base"] and summary["macs"] < summary["macs_base"]
    assert len(summary["top1_epochs"]) == 2 and "top-1 after epoch 2" in proc.stderr  # progress streamed
    artifact = Path(summary["artifact"])
    assert artifact.is_file() and artifact.parent == Path(summary["job_dir"])
    assert json.loads((artifact.parent / "summary.json").read_text())["status"] == "ok"

    # A data directory without the train/ and test/ folders: one line, no artifact, a failed record.
    flat = tmp_path / "flat"
    (flat / "0").mkdir(parents=True)
    proc = pictl_forks.run([*common, "--data-path", str(flat), "--epochs", "0"], env, 300)
    _one_error(proc, f"data directory {flat}: an ImageFolder for training or pruning needs train/")
    jobs = [d for d in (tmp_path / "prunes").iterdir() if d != artifact.parent]
    assert len(jobs) == 1 and not list(jobs[0].glob("*.safetensors"))
    assert json.loads((jobs[0] / "summary.json").read_text())["status"] == "failed"


def _prune_each_way(tmp_path: Path) -> dict:
    """DeiT-Ti pruned at 0.15 by each importance (hessian globally), each artifact rebuilt: {importance: (its
    artifact, the pruned model)}."""
    import torch

    from remote.floor.artifact_meta import ArtifactMeta
    from remote.floor.spec import IMPORTANCES, PruneSpec, RunSpec
    from remote.pruning.prune import prune_model
    from remote.toolkit.artifact import attention_heads, meta_model_for, save_artifact
    from remote.toolkit.model import Checkpoint, create_meta_model, materialize

    torch.manual_seed(0)
    x = torch.randn(2, 3, 224, 224)
    calib = [(torch.randn(2, 3, 224, 224), torch.tensor([3, 7]))]
    made = {}
    base = materialize(create_meta_model(DEIT, 1000), seed=0, checkpoint=None)
    base_params = sum(p.numel() for p in base.parameters())
    for imp in IMPORTANCES:
        spec = PruneSpec(model=DEIT, ratio=0.15, importance=imp, global_pruning=imp == "hessian")
        model = copy.deepcopy(base)
        _, params = prune_model(model, spec, x[:1], calib, torch.device("cpu"))
        assert params < base_params, imp
        with torch.no_grad():
            logits = model.eval()(x)
        assert logits.shape == (2, 1000) and torch.isfinite(logits).all(), imp
        path = tmp_path / f"{imp}.safetensors"
        save_artifact(model, ArtifactMeta(base_model=spec.model, num_classes=1000, ratio=0.15, importance=imp,
                                          heads=attention_heads(model), params=params,
                                          params_base=base_params), path)
        run = RunSpec(model=spec.model, num_classes=1000, checkpoint=str(path))
        rebuilt = materialize(meta_model_for(run), seed=0, checkpoint=Checkpoint(str(path)))
        with torch.no_grad():
            assert torch.equal(rebuilt(x), logits), f"{imp}: the artifact does not rebuild the pruned model"
        made[imp] = path, model
    return made


@pytest.mark.slow
def test_deit_each_importance(pictl_env, pictl_forks, tmp_path: Path) -> None:
    """Each importance prunes a DeiT at 0.15 on the installed timm; the artifact rebuilds exactly;
    a globally pruned one (uneven block widths) gives the same logits in 2 stages as serially. DeiT-Tiny: the
    lab's DeiT-S's blocks at half its width (3 heads, not 6), at a quarter of the suite's time."""
    import torch

    from remote.floor.errors import BadInput
    from remote.floor.spec import RunSpec
    from remote.toolkit.artifact import meta_model_for

    # One thread, as in the digits test: two on a 2-core machine that other work loads spin against it (26 s
    # instead of 9 s for the four prunes here beside other work).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        made = _prune_each_way(tmp_path)
    finally:
        torch.set_num_threads(threads)
    uneven = {b.mlp.fc1.out_features for b in made["hessian"][1].blocks}
    assert len(uneven) > 1, "global pruning should leave blocks of different widths"

    # The artifact describes its own model: asking for another is refused before anything loads.
    with pytest.raises(BadInput, match=f"pruned from {DEIT} with 1000 classes"):
        meta_model_for(RunSpec(model="deit_small_patch16_224", num_classes=1000, checkpoint=str(made["l1"][0])))

    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = pictl_forks.run(["run", "--headless", "--json", "--hosts", str(hosts), "--model", str(made["hessian"][0]),
                            "--stages", "2", "--policy", "equal", "--images", "4", "--warmup", "0", "--repeats", "1"],
                           pictl_forks.with_settings(pictl_env), 300)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["outputs_match"] is True and summary["max_abs_diff"] == 0.0
    assert summary["artifact"]["importance"] == "hessian"
    assert sum(st["params"] for st in summary["per_stage"]) == summary["artifact"]["params"]
    sent = [p for p in (tmp_path / "cluster").glob("h*/models/*.safetensors")]
    assert len(sent) == 2, "the artifact goes to every host once"


def test_whole_heads_are_removed_and_counted(tmp_path: Path) -> None:
    """--prune-heads drops heads of full width: the modules must say fewer heads, not narrower ones."""
    import torch

    from remote.floor.artifact_meta import ArtifactMeta
    from remote.floor.spec import PruneSpec, RunSpec
    from remote.pruning.prune import prune_model
    from remote.toolkit.artifact import attention_heads, meta_model_for, save_artifact
    from remote.toolkit.model import Checkpoint, create_meta_model, materialize

    kwargs = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 96, "num_heads": 4}
    model = materialize(create_meta_model("vit_tiny_patch16_224", 10, **kwargs), seed=0, checkpoint=None)
    x = torch.randn(2, 3, 32, 32)
    prune_model(model, PruneSpec(ratio=0.5, importance="l2", prune_heads=True), x[:1], [], torch.device("cpu"))
    assert [(b.attn.num_heads, b.attn.head_dim) for b in model.blocks] == [(2, 24), (2, 24)]
    path = save_artifact(model, ArtifactMeta(base_model="vit_tiny_patch16_224", num_classes=10,
                                             heads=attention_heads(model), model_kwargs=kwargs),
                         tmp_path / "heads.safetensors")
    rebuilt = materialize(meta_model_for(RunSpec(model="vit_tiny_patch16_224", num_classes=10, checkpoint=str(path))),
                          seed=0, checkpoint=Checkpoint(str(path)))
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model.eval()(x))
