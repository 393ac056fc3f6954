"""Parameter-efficient fine-tuning: LoRA adapters (the `peft` library) on a stage's attention projections.

`pictl train --lora R` gives every attention projection a stage holds a rank-R adapter, through `peft`'s own
`LoraModel`:
- a Hugging Face encoder's `query` and `value`;
- a timm ViT's fused `qkv`.

The adapters and the classifier head train; every other weight is frozen. Each adapter's `lora_A` is seeded by
the job's seed and its own name, as every weight of a stage is (`remote.toolkit.model.init_seeded`). `lora_B`
starts at zero, as peft starts it. So `single`, `pipeline` and `ddp` train the same function, whatever the split.

Before the trained model's logits are taken and its weights written, the adapters are merged into the weights
they adapt (`merge_and_unload`): the artifact is a plain model of the base architecture, and `pictl run` runs it
bit for bit as trained.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from remote.floor.errors import BadInput
from remote.toolkit.model import seed_for
from remote.toolkit.text_models import is_encoder_classifier

if TYPE_CHECKING:
    from peft.tuners.lora import LoraModel

HEADS = ("classifier", "head", "fc_norm")
"""What trains beside the adapters: the classification head (a new task's, in fine-tuning)."""


def _targets(model: nn.Module, name: str) -> list[str]:
    if is_encoder_classifier(model):
        return ["query", "value"]
    if isinstance(model, VisionTransformer):
        return ["qkv"]
    raise BadInput(f"--lora: model '{name}' is a {type(model).__name__}; LoRA adapts the attention of Hugging Face "
                   "encoders and timm ViTs")


def check_lora(model: nn.Module, name: str) -> None:
    """Refuse, before anything is built, a model LoRA does not adapt here."""
    _targets(model, name)


def add_lora(model: nn.Module, name: str, rank: int, seed: int) -> LoraModel | None:
    """Adapters on the attention projections `model` (one stage's, pruned) holds, in place; the rest frozen but
    the head. None when the stage holds no attention (its head, if any, still trains)."""
    try:
        from peft import LoraConfig
        from peft.tuners.lora import LoraModel
    except ImportError:
        raise BadInput("--lora: peft is not installed on this host (pip install peft)") from None
    targets = _targets(model, name)
    held = [n for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets and isinstance(m, nn.Linear)]
    wrapped = None
    if held:
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets, bias="none")
        wrapped = LoraModel(model, config, "default")  # (injects into `model` itself, and freezes its base)
        _seed_adapters(model, seed)
    for pname, p in model.named_parameters():
        p.requires_grad_("lora_" in pname or pname.split(".", 1)[0] in HEADS)
    return wrapped


@torch.no_grad()
def _seed_adapters(model: nn.Module, seed: int) -> None:
    """Each `lora_A` as peft draws it (Kaiming-uniform), from a generator of the seed and its name."""
    for pname, p in model.named_parameters():
        if ".lora_A." in pname:
            bound = 1 / math.sqrt(p.shape[1])  # kaiming_uniform_ with a = sqrt(5), as nn.Linear and peft use
            p.uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed_for(seed, pname)))


def merge(wrapped: LoraModel | None) -> None:
    """Fold the adapters into the weights they adapt, leaving the base architecture's modules and names."""
    if wrapped is not None:
        wrapped.merge_and_unload()
