"""Split points, the equal policy and the piece decomposition (in-process, no torchrun)."""

from __future__ import annotations

import functools

import pytest
import torch

from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.model import create_meta_model, materialize
from remote.toolkit.partition import equal_split, piece_params, plan, split_point_names
from remote.toolkit.pieces import vit_pieces
from remote.toolkit.stage import build_stage, layout_for


@pytest.fixture(scope="module")
def meta():
    return create_meta_model("deit_small_patch16_224", 1000)


@pytest.fixture(scope="module")
def pieces(meta):
    return vit_pieces(meta)


def test_pieces_cover_every_parameter_once(meta, pieces) -> None:
    assert len(pieces) == 75  # patch_embed, 12 blocks x 6, norm, head
    assert sum(piece_params(pieces, meta)) == sum(p.numel() for p in meta.parameters()) == 22_050_664


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6, 8])
def test_equal_policy_keeps_its_promise(meta, pieces, stages: int) -> None:
    """Greedy buckets of total//N parameters; a piece that would overflow starts the next stage."""
    sizes = piece_params(pieces, meta)
    per_stage = sum(sizes) // stages
    cuts = equal_split(sizes, stages)
    assert len(cuts) == stages - 1 and cuts == sorted(set(cuts))
    bounds = [0, *cuts, len(sizes)]
    for s in range(stages - 1):
        stage_sum = sum(sizes[bounds[s]:bounds[s + 1]])
        assert stage_sum <= per_stage
        assert stage_sum + sizes[bounds[s + 1]] > per_stage  # could not take the next piece


def test_equal_split_of_deit_small_into_four(meta, pieces) -> None:
    stages = plan(pieces, meta, stages=4, policy="equal", split_points=[])
    assert split_point_names(pieces, stages) == ["blocks.2.mlp.fc2", "blocks.5.mlp.fc2", "blocks.8.mlp.fc2"]
    params = [s.params for s in stages]
    # PiPPy's greedy buckets never exceed total // 4; the remainder lands in the last stage.
    assert all(p <= 22_050_664 // 4 for p in params[:3]) and sum(params) == 22_050_664


@pytest.mark.parametrize("points, message", [
    (["blocks.99"], "not a module of the model"),
    (["blocks.2.attn.q_norm"], "not a place a stage can begin"),
    (["blocks.3", "blocks.3"], "are the same place"),
    (["blocks.3", "blocks.3.norm1"], "are the same place"),
    (["patch_embed"], "first stage would be empty"),
    (["blocks.3", "blocks.6"], "make 3 stages, but 2 stages"),
])
def test_bad_split_points(meta, pieces, points: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        plan(pieces, meta, stages=2, policy="explicit", split_points=points)


def test_too_many_stages(meta, pieces) -> None:
    with pytest.raises(BadInput, match="76 stages asked for, but 75 is the most"):
        plan(pieces, meta, stages=76, policy="equal", split_points=[])
    assert len(plan(pieces, meta, stages=75, policy="equal", split_points=[])) == 75


def test_unknown_model() -> None:
    with pytest.raises(BadInput, match="unknown model 'deit_huge_nonsense'"):
        create_meta_model("deit_huge_nonsense", 10)


@functools.cache
def _whole_forward(model: str) -> tuple[torch.Tensor, torch.Tensor]:
    """An input and the whole model's logits for it (seeded weights), made once per model for every split."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        return x, materialize(create_meta_model(model, 10), seed=3, checkpoint=None)(x)


@pytest.mark.parametrize("points", [
    ["blocks.4"], ["blocks.1.attn"], ["blocks.2.attn.proj"], ["blocks.3.norm2"], ["blocks.7.mlp"],
    ["blocks.9.mlp.fc2"], ["norm"], ["head"], ["blocks.0.attn.proj", "blocks.0.norm2", "blocks.11.mlp.fc2"],
])
@pytest.mark.parametrize("model", ["deit_small_patch16_224", "deit3_small_patch16_224"])
def test_chained_stages_equal_the_whole_model_bit_for_bit(points: list[str], model: str) -> None:
    """Every kind of cut, chained in one process: logits identical to timm's own forward."""
    spec = RunSpec(model=model, num_classes=10, stages=len(points) + 1, policy="explicit",
                   split_points=points, seed=3)
    layout = layout_for(spec)
    x, expected = _whole_forward(model)
    with torch.no_grad():
        state = (x,)
        for stage in layout.stages:
            out = build_stage(spec, layout, stage, None)(*state)
            state = out if isinstance(out, tuple) else (out,)
    assert torch.equal(state[0], expected)
