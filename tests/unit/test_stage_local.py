"""Stage-local weights: a stage materialises, and reads from a checkpoint, only its own tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.model import Checkpoint, create_meta_model, materialize
from remote.toolkit.stage import build_stage, layout_for

MODEL = "deit_small_patch16_224"


@pytest.fixture(scope="module")
def full_state() -> dict[str, torch.Tensor]:
    model = materialize(create_meta_model(MODEL, 10), seed=11, checkpoint=None)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, full_state) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ckpt")
    save_file(full_state, d / "model.safetensors")
    torch.save(full_state, d / "model.pth")
    torch.save(materialize(create_meta_model(MODEL, 10), seed=11, checkpoint=None), d / "whole.pth")
    bad = dict(full_state, **{"head.weight": torch.zeros(7, 384), "head.bias": torch.zeros(7)})
    save_file(bad, d / "bad_shapes.safetensors")
    missing = {k: v for k, v in full_state.items() if not k.startswith("blocks.11.")}
    save_file(missing, d / "missing.safetensors")
    return {p.stem + p.suffix: p for p in d.iterdir()}


def _spec(**kw) -> RunSpec:
    return RunSpec(model=MODEL, num_classes=10, stages=4, policy="explicit",
                   split_points=["blocks.3", "blocks.6.attn.proj", "blocks.9"], seed=11, **kw)


@pytest.mark.parametrize("fmt", ["model.safetensors", "model.pth"])
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_stage_holds_exactly_its_own_tensors(checkpoints, full_state, fmt: str, rank: int) -> None:
    spec = _spec(checkpoint=str(checkpoints[fmt]))
    layout = layout_for(spec)
    stage = build_stage(spec, layout, layout.stages[rank], Checkpoint(spec.checkpoint))
    tensors = dict(stage.model.state_dict())
    # Only this stage's tensors exist, with real storage, equal to the checkpoint's.
    assert sum(t.numel() for t in tensors.values()) == layout.stages[rank].params
    assert all(t.device.type == "cpu" for t in tensors.values())
    assert all(torch.equal(t, full_state[k]) for k, t in tensors.items())
    others = {k for k in full_state if k not in tensors}
    assert others and not any(k in tensors for k in others)
    materialised = sum(p.numel() * p.element_size() for p in stage.parameters())
    assert materialised < 0.45 * sum(t.numel() * t.element_size() for t in full_state.values())


def test_random_init_is_the_same_whatever_the_split(full_state) -> None:
    spec = _spec()
    layout = layout_for(spec)
    for sp in layout.stages:
        for k, t in build_stage(spec, layout, sp, None).model.state_dict().items():
            assert torch.equal(t, full_state[k]), k


def test_checkpoint_with_wrong_shapes_is_refused(checkpoints) -> None:
    ckpt = Checkpoint(str(checkpoints["bad_shapes.safetensors"]))
    with pytest.raises(BadInput, match=r"'head.bias' has shape \[7\], the model expects \[10\]"):
        ckpt.check_fits({"head.bias": (10,)})


def test_checkpoint_missing_keys_is_refused(checkpoints) -> None:
    spec = _spec(checkpoint=str(checkpoints["missing.safetensors"]))
    layout = layout_for(spec)
    build_stage(spec, layout, layout.stages[0], Checkpoint(spec.checkpoint))  # stage 0 has what it needs
    with pytest.raises(BadInput, match="missing blocks.11"):
        build_stage(spec, layout, layout.stages[3], Checkpoint(spec.checkpoint))


def test_pickled_model_needs_explicit_opt_in(checkpoints, full_state) -> None:
    with pytest.raises(BadInput, match="pass --allow-pickle"):
        Checkpoint(str(checkpoints["whole.pth"]))
    ckpt = Checkpoint(str(checkpoints["whole.pth"]), allow_pickle=True)
    assert torch.equal(ckpt.tensor("head.weight"), full_state["head.weight"])


def test_missing_and_unknown_checkpoint_files(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        Checkpoint(str(tmp_path / "nope.pth"))
    (tmp_path / "w.onnx").write_bytes(b"x")
    with pytest.raises(BadInput, match="unknown format"):
        Checkpoint(str(tmp_path / "w.onnx"))
