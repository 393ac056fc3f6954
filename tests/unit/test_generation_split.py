"""`pictl generate`'s cuts without torch: `balanced` never leaves the largest stage heavier than `equal` does,
every cut is a valid layer boundary, and explicit cuts are checked against the model's layers."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pictl import errors as E
from pictl.jobs.generation.options import ModelShape, built_shape, generate_options, stage_starts


def _shape(layers: int, hidden: int, vocab: int) -> ModelShape:
    return ModelShape.model_validate({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
                                      "intermediate_size": 3 * hidden, "num_attention_heads": 4,
                                      "vocab_size": vocab})


def _heaviest(shape: ModelShape, starts: list[int]) -> int:
    bounds = [0, *starts, shape.layers]
    return max(shape.stage_params(a, b) - (shape.vocab * shape.hidden if a == 0 else 0)
               for a, b in zip(bounds, bounds[1:], strict=False))


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 40), stages=st.integers(1, 8), hidden=st.sampled_from([64, 128, 896]),
       vocab=st.integers(16, 200_000))
def test_balanced_cuts_are_valid_and_never_heavier_than_equal(layers: int, stages: int, hidden: int,
                                                              vocab: int) -> None:
    if stages > layers:
        return
    shape = _shape(layers, hidden, vocab)
    balanced = stage_starts(generate_options({"stages": stages}), shape, "m")
    equal = stage_starts(generate_options({"stages": stages, "policy": "equal"}), shape, "m")
    for cuts in (balanced, equal):
        assert len(cuts) == stages - 1 and all(0 < c < layers for c in cuts) and cuts == sorted(set(cuts))
    assert _heaviest(shape, balanced) <= _heaviest(shape, equal)


def test_qwen25_05b_gives_its_last_stage_one_layer_beside_the_head() -> None:
    options = generate_options({"size": "qwen2.5-0.5b", "stages": 4})
    assert options.arch == "qwen2"
    assert stage_starts(options, built_shape(options), options.label) == [7, 15, 23]


@pytest.mark.parametrize(("given_", "said"), [
    ({"stages": 2, "split": [0]}, "valid cuts: 1..7"),
    ({"stages": 3, "split": [5, 3]}, "increasing order"),
    ({"stages": 9}, "has 8 decoder layer(s)"),
    ({"stages": 2, "split": [2, 4]}, "2 stages need 1 cut(s)"),
])
def test_explicit_cuts_are_checked_against_the_layers(given_: dict, said: str) -> None:
    options = generate_options(given_)
    with pytest.raises(E.ConfigError, match=re.escape(said)):
        stage_starts(options, built_shape(options), options.label)


def test_a_configured_head_width_is_what_the_checks_count() -> None:
    """Qwen3's heads are 128 wide by default whatever the width: a configuration's `head_dim` sizes the
    attention and the KV cache; a model pictl builds is given its own (hidden / heads)."""
    base = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 128, "intermediate_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
    narrow, wide = ModelShape.model_validate(base), ModelShape.model_validate({**base, "head_dim": 128})
    assert (narrow.head_dim, wide.head_dim) == (32, 128)
    assert wide.kv_bytes_per_position(4) == 4 * narrow.kv_bytes_per_position(4) == 4 * 2 * 2 * 128 * 4
    assert wide.layer_params() - narrow.layer_params() == 2 * 128 * (4 * 96) + 2 * 128 * (2 * 96)
    built = generate_options({"arch": "qwen3"})
    assert built.sizes()["head_dim"] == 32 and built_shape(built).head_dim == 32


@pytest.mark.parametrize("prompts", [[[]], [[-1]], [[1]] * 257, [[0] * 4097]])
def test_prompts_given_to_the_api_are_checked_as_the_file_is(prompts: list) -> None:
    with pytest.raises(E.ConfigError, match="prompts"):
        generate_options({"prompts": prompts})
