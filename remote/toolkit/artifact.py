"""Pruned models as artifacts: written atomically, rebuilt on a host without unpickling.

Writing: the pruned model's state dict goes into a `.safetensors` file whose header
carries `ArtifactMeta`. Reading: the base architecture is created on the meta device,
each tensor is given the shape it has in the file, and the modules whose behaviour
depends on a width (Linear, LayerNorm, Conv2d, timm's Attention) are told their new
widths. A forward pass on meta tensors then proves the shapes fit together before
any memory is spent.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from remote.data.images import takes_token_ids
from remote.floor.artifact_meta import ArtifactMeta, read_artifact_meta, read_header
from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.kept_pair import PAIRS, attach_pairs, whole_forward
from remote.toolkit.model import create_meta_model


def attention_heads(model: nn.Module) -> dict[str, int]:
    return {name: int(m.num_heads) for name, m in model.named_modules() if _is_attention(m)}


def _is_attention(m: nn.Module) -> bool:
    return hasattr(m, "num_heads") and hasattr(m, "head_dim") and isinstance(getattr(m, "qkv", None), nn.Linear)


def set_attention_widths(model: nn.Module, heads: dict[str, int] | None = None) -> None:
    """Make each attention layer's head bookkeeping agree with its (pruned) qkv.

    The scale follows the new head dim: the fused path (scaled_dot_product_attention)
    derives it from q's width anyway, so the unfused path must do the same for the
    two to agree.
    """
    for name, m in model.named_modules():
        if not _is_attention(m):
            continue
        if heads is not None:
            m.num_heads = heads[name]
        width = m.qkv.out_features // 3
        if width % m.num_heads:
            raise BadInput(f"attention '{name}': width {width} does not divide into {m.num_heads} heads")
        m.head_dim = width // m.num_heads
        m.attn_dim = width
        m.scale = m.head_dim ** -0.5


def pruned_widths(model: nn.Module) -> dict:
    blocks = []
    for blk in getattr(model, "blocks", []):
        blocks.append({"heads": int(blk.attn.num_heads), "head_dim": int(blk.attn.head_dim),
                       "mlp": int(blk.mlp.fc1.out_features)})
    return {"embed_dim": int(model.pos_embed.shape[-1]) if getattr(model, "pos_embed", None) is not None else None,
            "blocks": blocks}


def save_artifact(model: nn.Module, meta: ArtifactMeta, path: str | Path) -> Path:
    """Write atomically: a reader sees the old file or the whole new one, never half of one."""
    from safetensors.torch import save_file

    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    try:
        save_file(tensors, str(tmp), metadata=meta.to_header())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _resize(module: nn.Module, attr: str, shape: tuple[int, ...]) -> None:
    old = getattr(module, attr)
    new = torch.empty(shape, device="meta", dtype=old.dtype)
    if isinstance(old, nn.Parameter):
        module._parameters[attr] = nn.Parameter(new, requires_grad=old.requires_grad)
    else:
        module._buffers[attr] = new


def _fix_widths(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.out_features, m.in_features = m.weight.shape
        elif isinstance(m, nn.LayerNorm) and m.weight is not None:
            m.normalized_shape = tuple(m.weight.shape)
        elif isinstance(m, nn.Conv2d):
            m.out_channels = m.weight.shape[0]
            m.in_channels = m.weight.shape[1] * m.groups
    for attr in ("embed_dim", "num_features", "head_hidden_size"):
        if hasattr(model, attr) and getattr(model, "pos_embed", None) is not None:
            setattr(model, attr, int(model.pos_embed.shape[-1]))


def apply_architecture(model: nn.Module, path: Path, meta: ArtifactMeta) -> nn.Module:
    """Reshape a meta-device base model into the pruned one stored in `path`."""
    shapes = {k: tuple(v["shape"]) for k, v in read_header(path).items() if k != "__metadata__"}
    state = model.state_dict(keep_vars=True)
    missing = sorted(set(state) - set(shapes))
    extra = sorted(set(shapes) - set(state))
    if missing or extra:
        names = ", ".join((missing or extra)[:3])
        raise BadInput(f"model artifact {path}: does not match {meta.base_model} "
                       f"({'missing' if missing else 'unexpected'} tensors {names})")
    for key, shape in shapes.items():
        if tuple(state[key].shape) != shape:
            owner, _, attr = key.rpartition(".")
            _resize(model.get_submodule(owner) if owner else model, attr, shape)
    _fix_widths(model)
    unknown = set(meta.heads) - set(attention_heads(model))
    if unknown or set(attention_heads(model)) - set(meta.heads):
        raise BadInput(f"model artifact {path}: its head counts name other attention layers than "
                       f"{meta.base_model} has")
    set_attention_widths(model, meta.heads)
    cfg = getattr(model, "pretrained_cfg", {})
    size = tuple(cfg.get("input_size", (3, 224, 224)))
    text = takes_token_ids(cfg)  # a text model: token ids in, and its pieces as the forward (`whole_forward`)
    try:
        with torch.no_grad():  # (kept compressor pairs are checked against their cuts below, on their own)
            (whole_forward(model) if text else model)(
                torch.empty((1, *size), device="meta", dtype=torch.long if text else torch.float32))
    except Exception as exc:  # the shapes do not chain: say so before anything is allocated
        raise BadInput(f"model artifact {path}: its tensors do not form a working {meta.base_model} "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    return model


def meta_model_from_artifact(path: str | Path, *, model: str, num_classes: int) -> nn.Module | None:
    """The pruned architecture stored in `path` (None when it is a plain state dict)."""
    meta = read_artifact_meta(path)
    if meta is None:
        return None
    if model != meta.base_model or num_classes != meta.num_classes:
        raise BadInput(f"model artifact {path}: pruned from {meta.base_model} with {meta.num_classes} classes, "
                       f"but the run asks for {model} with {num_classes}")
    model = create_meta_model(meta.base_model, meta.num_classes, **meta.model_kwargs)
    if meta.compressors:
        cuts = [c.get("at") if isinstance(c, dict) else None for c in meta.compressors]
        if not all(isinstance(c, str) and c for c in cuts):
            raise BadInput(f"model artifact {path}: its compressors do not name their cuts")
        shapes = {k: tuple(v["shape"]) for k, v in read_header(path).items() if k.startswith(f"{PAIRS}.")}
        attach_pairs(model, cuts, shapes, str(path))  # type: ignore[arg-type]  (checked: every cut a name)
    model = apply_architecture(model, Path(path).expanduser(), meta)
    if meta.compressors and isinstance(model, VisionTransformer):  # the pairs fit their cuts, before any memory
        size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        try:
            with torch.no_grad():
                whole_forward(model)(torch.empty((1, *size), device="meta"))
        except BadInput:
            raise
        except Exception as exc:
            raise BadInput(f"model artifact {path}: its compressor pairs do not fit their cuts "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    return model


def meta_model_for(spec: RunSpec) -> nn.Module:
    """The run's architecture: the named timm model, a Hugging Face classifier (`hf:...`), a user's own
    (`package.module:factory`), or the pruned one its checkpoint describes."""
    if spec.checkpoint and spec.checkpoint.endswith(".safetensors"):
        pruned = meta_model_from_artifact(spec.checkpoint, model=spec.model, num_classes=spec.num_classes)
        if pruned is not None:
            return pruned
    return create_meta_model(spec.model, spec.num_classes, tokens=spec.tokens)
