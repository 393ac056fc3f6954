"""A model kept with its learned compressor pair: rebuilt from the artifact, run as pieces around its cut, the
same whole or split; crafted artifacts whose pairs do not fit are refused with one line before any memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from remote.floor.artifact_meta import ArtifactMeta
from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.artifact import attention_heads, meta_model_for
from remote.toolkit.kept_pair import run_pieces, with_pairs
from remote.toolkit.model import Checkpoint, create_meta_model, materialize
from remote.toolkit.pieces import vit_pieces
from remote.toolkit.stage import build_stage, layout_for

KWARGS = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 96, "num_heads": 4}
MODEL = "vit_tiny_patch16_224"


def _artifact(tmp_path: Path, *, cut: str = "blocks.1", code: int = 24, decoder_out: int = 96,
              meta_cuts: list[str] | None = None) -> Path:
    model = materialize(create_meta_model(MODEL, 10, **KWARGS), seed=0, checkpoint=None)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    tensors |= {"wire_pairs.0.encoders.0.weight": torch.randn(code, 96, generator=gen) / 10,
                "wire_pairs.0.encoders.0.bias": torch.zeros(code),
                "wire_pairs.0.decoders.0.weight": torch.randn(decoder_out, code, generator=gen) / 5,
                "wire_pairs.0.decoders.0.bias": torch.zeros(decoder_out)}
    meta = ArtifactMeta(base_model=MODEL, num_classes=10, heads=attention_heads(model), model_kwargs=KWARGS,
                        compressors=[{"at": c, "wire": "convinsert:0.25"} for c in (meta_cuts or [cut])])
    path = tmp_path / "kept.safetensors"
    save_file(tensors, str(path), metadata=meta.to_header())
    return path


def _spec(path: Path, **kw) -> RunSpec:
    return RunSpec(model=MODEL, num_classes=10, checkpoint=str(path), seed=0, **kw)


def test_a_kept_pair_runs_around_its_cut_whole_or_split(tmp_path: Path) -> None:
    path = _artifact(tmp_path)
    model = materialize(meta_model_for(_spec(path)), seed=0, checkpoint=Checkpoint(str(path)))
    pieces = with_pairs(vit_pieces(model), model)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = run_pieces(pieces, model, x)
        assert not torch.equal(whole, model(x))  # timm's own forward would skip the pair
        pair = model.wire_pairs[0]
        state = run_pieces(vit_pieces(model)[:7], model, x)  # patch_embed and block 0: the state at blocks.1
        rest = (pair["decoders"][0](pair["encoders"][0](state)),)
        for piece in vit_pieces(model)[7:]:
            rest = piece.fn(model, rest)
        assert torch.equal(whole, rest[0])
        # Split at the pair: stage 0 ends with the compressor, so the code is what crosses.
        for split in (["blocks.1"], ["blocks.0.mlp.fc2"]):
            layout = layout_for(_spec(path, stages=2, policy="explicit", split_points=split))
            first, second = (build_stage(_spec(path), layout, s, Checkpoint(str(path))) for s in layout.stages)
            sent = first(x)
            sent = sent if isinstance(sent, tuple) else (sent,)
            if split == ["blocks.1"]:
                assert sent[0].shape == (2, 17, 24)
            assert torch.equal(second(*sent), whole)


@pytest.mark.parametrize(("kw", "says"), [
    ({"decoder_out": 80}, "do not fit their cuts"),
    ({"meta_cuts": ["blocks.7"]}, "'blocks.7', which is not a cut"),
    ({"meta_cuts": ["patch_embed"]}, "not a cut"),
    ({"meta_cuts": ["blocks.1", "blocks.0"]}, "no usable encoders"),
])
def test_a_crafted_pair_is_refused_before_any_memory(tmp_path: Path, kw: dict, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        layout_for(_spec(_artifact(tmp_path, **kw)))
