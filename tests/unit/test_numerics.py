"""int8-dynamic stages: the same numbers split or whole (so a quantised pipeline is checked bit for bit against a
quantised serial run), different from fp32's, and unknown numerics refused on the host."""

from __future__ import annotations

import copy

import pytest
import torch

from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.model import create_meta_model, materialize
from remote.toolkit.numerics import apply_numerics, check_numerics
from remote.toolkit.stage import build_stage, layout_for


def test_int8_stages_compute_what_the_int8_model_computes() -> None:
    spec = RunSpec(model="deit_tiny_patch16_224", num_classes=10, stages=2, policy="explicit",
                   split_points=["blocks.6.attn.proj"], numerics="int8-dynamic")
    whole = materialize(create_meta_model(spec.model, 10), seed=0, checkpoint=None)
    fp32 = copy.deepcopy(whole)
    engine = apply_numerics(whole, spec.numerics)
    assert engine == check_numerics(spec.numerics) and engine in ("x86", "fbgemm", "qnnpack")
    layout = layout_for(spec)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, reference = whole(x), fp32(x)
        stages = [build_stage(spec, layout, s, None) for s in layout.stages]
        out = stages[1](*stages[0](x))
    assert torch.equal(out, expected)  # split inside a block, in int8: the whole int8 model's numbers
    assert not torch.equal(expected, reference) and (expected - reference).abs().max() < 0.5


@pytest.mark.parametrize("numerics", ["int4", "fp16", ""])
def test_unknown_numerics_are_refused(numerics: str) -> None:
    with pytest.raises(BadInput, match="is not one of fp32, int8-dynamic"):
        check_numerics(numerics)
