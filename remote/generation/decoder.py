"""A decoder-only transformer cut between its layers: the stage a rank (or the serial run) computes.

A stage is the architecture's own Hugging Face model, built from a configuration with only the stage's layers
(`num_hidden_layers` = its share, numbered from 0, so its KV cache is its own) and weights taken by their names
in the whole model: layer `k` of a stage that begins at layer `a` holds `model.layers.{a+k}.*`. The first stage
embeds the prompt's token ids; the others take the hidden states the stage before sent; the last applies the
final norm and the language-model head to the last position and picks the next token greedily. The model's own
`forward` builds the causal mask and rotary positions from the stage's cache, as it does whole.

Weights come from a model directory's safetensors (no pickles) or, for a model built from its configuration, from a
generator seeded by the job's seed and each weight's name: every stage and the serial run hold the same values
without any of them building the whole model.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from remote.floor.errors import BadInput
from remote.floor.spec import DECODER_ARCHS, GenerateSpec
from remote.toolkit.numerics import apply_numerics

if TYPE_CHECKING:  # (transformers is imported where it is used: a 2-3 s import)
    from transformers import DynamicCache, PretrainedConfig

LAYER_PREFIX = "model.layers."


def model_config(spec: GenerateSpec) -> PretrainedConfig:
    """The whole model's configuration: the directory's `config.json`, or the architecture's defaults with the
    spec's sizes over them."""
    from transformers import AutoConfig

    if spec.model_dir:
        path = Path(spec.model_dir).expanduser()
        if not (path / "config.json").is_file():
            raise BadInput(f"model directory {path}: no config.json")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except (ValueError, OSError, json.JSONDecodeError) as exc:
            raise BadInput(f"model directory {path}: {exc}") from None
    else:
        if spec.arch not in DECODER_ARCHS:
            raise BadInput(f"--arch {spec.arch}: pictl generate builds {', '.join(DECODER_ARCHS)}")
        try:
            config = AutoConfig.for_model(spec.arch, **spec.sizes)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"--arch {spec.arch} with {spec.sizes}: {exc}") from None
    if getattr(config, "model_type", None) not in DECODER_ARCHS:
        raise BadInput(f"model {spec.model_dir or spec.arch}: architecture {config.model_type!r} is not one pictl "
                       f"cuts between decoder layers ({', '.join(DECODER_ARCHS)})")
    config.use_cache = True
    return config


def stage_bounds(layers: int, split: list[int], stage: int) -> tuple[int, int]:
    """The decoder layers [first, end) of `stage` under `split` (the first layer of stages 2..N)."""
    starts = [0, *split, layers]
    return starts[stage], starts[stage + 1]


def _stage_config(config: PretrainedConfig, first: int, end: int) -> PretrainedConfig:
    local = config.__class__.from_dict(config.to_dict())
    local.num_hidden_layers = end - first
    types = getattr(config, "layer_types", None)
    if types:
        local.layer_types = list(types[first:end])
    return local


def _global_name(name: str, first: int) -> str:
    """A stage's weight name as the whole model names it."""
    if name.startswith(LAYER_PREFIX):
        index, rest = name[len(LAYER_PREFIX):].split(".", 1)
        return f"{LAYER_PREFIX}{int(index) + first}.{rest}"
    return name


@dataclass
class DecoderStage:
    """One stage of the model: its HF model (only its layers), where it sits, and how to run one step."""

    model: nn.Module
    first_layer: int
    end_layer: int
    first: bool
    last: bool
    config: PretrainedConfig
    engine: str | None = None
    """The quantised engine of an int8 stage (None: fp32)."""

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def new_cache(self) -> DynamicCache:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def step(self, x: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Token ids (first stage) or hidden states in; hidden states out, or on the last stage the next token's id
        (a 1-element int64 tensor)."""
        inner = self.model.model
        out = inner(input_ids=x, cache=cache, use_cache=True) if self.first else \
            inner(inputs_embeds=x, cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if not self.last:
            return hidden.contiguous()
        logits = self.model.lm_head(hidden[:, -1:, :])
        return logits[0, -1].argmax().reshape(1)


def build_stage(spec: GenerateSpec, stage: int, stages: int) -> DecoderStage:
    """The layers of `stage` (of `stages`) with their weights; the embedding only on the first, the final norm and
    head only on the last."""
    from transformers import AutoModelForCausalLM

    config = model_config(spec)
    first, end = stage_bounds(config.num_hidden_layers, list(spec.split), stage)
    local = _stage_config(config, first, end)
    # Built without memory (the meta device), what this stage never computes dropped, then only the rest allocated:
    # a stage's peak is its own weights, never the whole model's (a tied head keeps the embedding's tensor).
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(local, dtype=torch.float32)
    model.eval()
    is_first, is_last = stage == 0, stage == stages - 1
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if not is_last:
        model.model.norm = nn.Identity()
        model.lm_head = None
    if not is_first and not (is_last and tied):
        model.model.embed_tokens = None
    model.to_empty(device="cpu")
    if tied and model.lm_head is not None:  # (to_empty may allocate the two names apart: one tensor again)
        model.lm_head.weight = model.model.embed_tokens.weight
    # The rotary embedding's frequencies are computed, not weights: made again on the CPU.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=local)
    if spec.model_dir:
        _load(model, Path(spec.model_dir).expanduser(), first, tied)
    else:
        _seeded(model, spec.seed, first, float(getattr(config, "initializer_range", 0.02)), tied)
    if not is_first:
        model.model.embed_tokens = None  # (a tied last stage's head holds the tensor)
    engine = apply_numerics(model, spec.numerics)
    return DecoderStage(model, first, end, is_first, is_last, config, engine)


def _names(model: nn.Module, first: int, tied: bool) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Each parameter once: its name in the stage, in the whole model (a tied head is the embedding), the tensor."""
    for name, param in model.named_parameters():
        global_name = _global_name(name, first)
        if tied and global_name == "lm_head.weight":
            global_name = "model.embed_tokens.weight"
        yield name, global_name, param


@torch.no_grad()
def _seeded(model: nn.Module, seed: int, first: int, std: float, tied: bool) -> None:
    for _name, global_name, param in _names(model, first, tied):
        generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{global_name}".encode()))
        if global_name.endswith("norm.weight"):
            param.fill_(1.0)
        elif global_name.endswith(".bias"):
            param.zero_()
        else:
            param.normal_(0.0, std, generator=generator)  # (in place: no temporary the size of the embedding)


@torch.no_grad()
def _load(model: nn.Module, path: Path, first: int, tied: bool) -> None:
    """The stage's tensors from the directory's safetensors files, by their names in the whole model."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise BadInput(f"model directory {path}: no *.safetensors weights (pickled weights are not loaded)")
    wanted = {global_name: param for _name, global_name, param in _names(model, first, tied)}
    # A tied head is the embedding's tensor: a file may hold it under either name (one pass reads it from either).
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}
    found: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                target = key if key in wanted else aliases.get(key)
                if target not in wanted or target in found:
                    continue
                tensor = f.get_tensor(key)
                if tuple(tensor.shape) != tuple(wanted[target].shape):
                    raise BadInput(f"model directory {path}: {key} has shape {tuple(tensor.shape)}, its "
                                   f"config.json gives {tuple(wanted[target].shape)}")
                wanted[target].copy_(tensor)
                found.add(target)
    missing = sorted(set(wanted) - found)
    if missing:
        raise BadInput(f"model directory {path}: no tensor {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                                          if len(missing) > 1 else ""))
