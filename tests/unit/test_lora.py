"""LoRA adapters for fine-tuning (`remote.training.lora`): on a timm ViT's fused qkv and a Hugging Face encoder's
query and value, seeded by name so two processes build the same adapters; only the adapters and the head train;
merged, the model has the base architecture's names and computes what it computed with the adapters; a CNN
is refused in one line. A real training job: tests/functional/test_train.py."""

from __future__ import annotations

import copy

import pytest
import torch

from remote.floor.errors import BadInput
from remote.toolkit.model import create_meta_model, materialize
from remote.training.lora import add_lora, check_lora, merge

pytest.importorskip("peft")

VIT = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 32, "num_heads": 2}


def _vit() -> torch.nn.Module:
    return materialize(create_meta_model("vit_tiny_patch16_224", 5, **VIT), seed=1, checkpoint=None)


def test_adapters_are_seeded_by_name_only_they_and_the_head_train_and_merging_keeps_the_function() -> None:
    a, b = _vit(), _vit()
    base = {k: v.clone() for k, v in a.state_dict().items()}
    wrapped = add_lora(a, "vit_tiny_patch16_224", 4, seed=3)
    add_lora(b, "vit_tiny_patch16_224", 4, seed=3)
    trainable = sorted(n for n, p in a.named_parameters() if p.requires_grad)
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable), trainable
    assert {n.split(".lora_")[0] for n in trainable if "lora_" in n} == {"blocks.0.attn.qkv", "blocks.1.attn.qkv"}
    assert all(torch.equal(p, dict(b.named_parameters())[n]) for n, p in a.named_parameters())  # same adapters
    with torch.no_grad():
        for n, p in a.named_parameters():
            if ".lora_B." in n:
                p.normal_(generator=torch.Generator().manual_seed(0))  # as if trained
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        adapted = a(x)
        merge(wrapped)
        assert set(a.state_dict()) == set(base)
        assert torch.allclose(a(x), adapted, atol=1e-5)
        assert not torch.equal(a.state_dict()["blocks.0.attn.qkv.weight"], base["blocks.0.attn.qkv.weight"])
        assert torch.equal(a.state_dict()["blocks.0.mlp.fc1.weight"], base["blocks.0.mlp.fc1.weight"])


def test_a_stage_without_attention_trains_its_head_alone_and_a_cnn_is_refused() -> None:
    vit = _vit()
    head_only = copy.deepcopy(vit)
    head_only.blocks = torch.nn.Sequential()
    assert add_lora(head_only, "vit_tiny_patch16_224", 4, seed=0) is None
    assert sorted(n for n, p in head_only.named_parameters() if p.requires_grad) == ["head.bias", "head.weight"]
    with pytest.raises(BadInput, match="--lora: model 'resnet18' is a ResNet; LoRA adapts the attention"):
        check_lora(create_meta_model("resnet18", 5), "resnet18")
