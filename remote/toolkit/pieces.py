"""A timm VisionTransformer as an ordered list of pieces, each a place a stage may begin.

A split point is the module name where a piece begins ("a new stage begins here"):
`blocks.3`, `blocks.2.attn.proj`, `blocks.7.mlp.fc2`, `norm`, `head`. Between two
pieces the pipeline carries a state tuple: `(x,)` at a block boundary, or
`(hidden, residual)` inside a block, since the block's residual add is still to
come. The arithmetic is timm's own, op for op, so a split model's logits equal the
whole model's bit for bit (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.vision_transformer import Attention, Block, VisionTransformer

from remote.floor.errors import BadInput

State = tuple[torch.Tensor, ...]
PieceFn = Callable[[VisionTransformer, State], State]


@dataclass(frozen=True)
class Piece:
    """One indivisible step of the forward pass."""

    name: str
    """The split-point name at which this piece begins."""
    aliases: tuple[str, ...]
    """Other module names that begin at the same place (`blocks.3.norm1` = `blocks.3`)."""
    modules: tuple[str, ...]
    """Module and parameter names this piece uses: all a stage must materialise."""
    block: int | None
    """Index of the transformer block this piece belongs to, if any."""
    fn: PieceFn


def _embed(m: VisionTransformer, s: State) -> State:
    x = m.patch_embed(s[0])
    x = m._pos_embed(x)
    x = m.patch_drop(x)
    return (m.norm_pre(x),)


def _attention_before_proj(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """timm's Attention.forward up to (not including) `proj`, without masks."""
    B, N, _ = x.shape
    gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.fused_attn:
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    else:
        q = q * attn.scale
        a = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = attn.attn_drop(a) @ v
    attn_dim = getattr(attn, "attn_dim", attn.num_heads * attn.head_dim)
    x = x.transpose(1, 2).reshape(B, N, attn_dim)
    x = attn.norm(x)
    return x * gate if gate is not None else x


def _block_pieces(i: int, blk: Block) -> list[Piece]:
    p = f"blocks.{i}"

    def norm1(m: VisionTransformer, s: State) -> State:
        return (m.blocks[i].norm1(s[0]), s[0])

    def attn_core(m: VisionTransformer, s: State) -> State:
        return (_attention_before_proj(m.blocks[i].attn, s[0]), s[1])

    def attn_proj(m: VisionTransformer, s: State) -> State:
        b = m.blocks[i]
        h = b.attn.proj_drop(b.attn.proj(s[0]))
        return (s[1] + b.drop_path1(b.ls1(h)),)

    def norm2(m: VisionTransformer, s: State) -> State:
        return (m.blocks[i].norm2(s[0]), s[0])

    def mlp_fc1(m: VisionTransformer, s: State) -> State:
        mlp = m.blocks[i].mlp
        return (mlp.norm(mlp.drop1(mlp.act(mlp.fc1(s[0])))), s[1])

    def mlp_fc2(m: VisionTransformer, s: State) -> State:
        b = m.blocks[i]
        h = b.mlp.drop2(b.mlp.fc2(s[0]))
        return (s[1] + b.drop_path2(b.ls2(h)),)

    core = [f"{p}.attn.{n}" for n in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "gate")
            if getattr(blk.attn, n, None) is not None]
    return [
        Piece(p, (f"{p}.norm1",), (f"{p}.norm1",), i, norm1),
        Piece(f"{p}.attn", (f"{p}.attn.qkv",), tuple(core), i, attn_core),
        Piece(f"{p}.attn.proj", (), (f"{p}.attn.proj", f"{p}.attn.proj_drop", f"{p}.ls1",
                                     f"{p}.drop_path1"), i, attn_proj),
        Piece(f"{p}.norm2", (), (f"{p}.norm2",), i, norm2),
        Piece(f"{p}.mlp", (f"{p}.mlp.fc1",), (f"{p}.mlp.fc1", f"{p}.mlp.act", f"{p}.mlp.drop1",
                                            f"{p}.mlp.norm"), i, mlp_fc1),
        Piece(f"{p}.mlp.fc2", (), (f"{p}.mlp.fc2", f"{p}.mlp.drop2", f"{p}.ls2",
                                   f"{p}.drop_path2"), i, mlp_fc2),
    ]


def _final_norm(m: VisionTransformer, s: State) -> State:
    return (m.norm(s[0]),)


def _head(m: VisionTransformer, s: State) -> State:
    return (m.forward_head(s[0]),)


def check_supported(model: torch.nn.Module, name: str) -> VisionTransformer:
    """Refuse, with one clear line, models whose forward pass these pieces do not mirror."""
    if not isinstance(model, VisionTransformer):
        raise BadInput(f"model '{name}' is a {type(model).__name__}; pictl splits timm "
                       "VisionTransformer models (deit_*, deit3_*, vit_*)")
    if model.dynamic_img_size or model.attn_pool is not None:
        raise BadInput(f"model '{name}': dynamic image size and attention pooling are not supported")
    for i, blk in enumerate(model.blocks):
        if type(blk) is not Block or not isinstance(blk.attn, Attention) or type(blk.mlp) is not Mlp:
            raise BadInput(f"model '{name}': blocks.{i} is a {type(blk).__name__} "
                           "(pictl splits timm's standard Block/Attention/Mlp)")
    return model


def vit_pieces(model: VisionTransformer) -> list[Piece]:
    """The model's forward pass, in order, as pieces."""
    embed_modules = ["patch_embed", "pos_drop", "patch_drop", "norm_pre"]
    embed_modules += [n for n in ("cls_token", "reg_token", "pos_embed") if getattr(model, n) is not None]
    pieces = [Piece("patch_embed", (), tuple(embed_modules), None, _embed)]
    for i, blk in enumerate(model.blocks):
        pieces += _block_pieces(i, blk)
    pieces.append(Piece("norm", (), ("norm",), None, _final_norm))
    pieces.append(Piece("head", ("fc_norm",), ("fc_norm", "head_drop", "head"), None, _head))
    return pieces


def block_piece_count() -> int:
    """Pieces per transformer block (a stage holding all of them runs the block whole)."""
    return 6
