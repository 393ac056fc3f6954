"""A learned compressor pair kept in a trained model: convinsert's halves as part of its forward pass.

`pictl train --wire convinsert:RATE --keep-compressor` writes each cut's pair into the merged artifact under
`wire_pairs.N.encoders.I.*` and `wire_pairs.N.decoders.I.*` (one per state tensor at the cut) and names the
cuts in its header (`ArtifactMeta.compressors`). Read back, the pair becomes part of the model's pieces: the
piece before the cut ends with the encoder, the piece at the cut begins with the decoder. A run cut there
sends the code, the bytes the training saved; cut anywhere else, or run whole, the two halves run back to
back. Either way the model computes what the pipeline was trained to compute, and the serial baseline runs
the same pieces, so a pipelined run's outputs stay bit-identical to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from remote.floor.errors import BadInput
from remote.toolkit.pieces import Piece, State, vit_pieces
from remote.toolkit.text_models import is_encoder_classifier, text_pieces

PAIRS = "wire_pairs"


def _half(weight: tuple[int, ...], side: str) -> nn.Module:
    """An encoder or decoder from its weight's shape: a Linear's (out, in); a Conv2d's (out, in, 2, 2); a
    ConvTranspose2d's (in, out, 2, 2)."""
    if len(weight) == 2:
        return nn.Linear(weight[1], weight[0])
    if side == "encoders":
        return nn.Conv2d(weight[1], weight[0], 2, stride=2)
    return nn.ConvTranspose2d(weight[0], weight[1], 2, stride=2)


def attach_pairs(model: nn.Module, cuts: list[str], shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """Give the (meta) `model` the pairs the artifact's tensors `shapes` hold, one per cut of `cuts`."""
    pairs = nn.ModuleList()
    with torch.device("meta"):
        for n in range(len(cuts)):
            sides = {}
            for side in ("encoders", "decoders"):
                count = len({k.split(".")[3] for k in shapes if k.startswith(f"{PAIRS}.{n}.{side}.")})
                weights = [shapes.get(f"{PAIRS}.{n}.{side}.{i}.weight") for i in range(count)]
                if not count or any(w is None or len(w) not in (2, 4) for w in weights):
                    raise BadInput(f"model artifact {source}: the compressor at {cuts[n]} has no usable {side}")
                sides[side] = nn.ModuleList(_half(w, side) for w in weights if w is not None)
            pairs.append(nn.ModuleDict(sides))
    setattr(model, PAIRS, pairs)
    model.wire_pair_cuts = list(cuts)


def _encoding(piece: Piece, n: int) -> Piece:
    def fn(m: nn.Module, s: State) -> State:
        out = piece.fn(m, s)
        return tuple(enc(t) for enc, t in zip(getattr(m, PAIRS)[n]["encoders"], out, strict=True))
    return replace(piece, modules=(*piece.modules, f"{PAIRS}.{n}.encoders"), block=None, fn=fn)


def _decoding(piece: Piece, n: int) -> Piece:
    def fn(m: nn.Module, s: State) -> State:
        state = tuple(dec(t) for dec, t in zip(getattr(m, PAIRS)[n]["decoders"], s, strict=True))
        return piece.fn(m, state)
    return replace(piece, modules=(*piece.modules, f"{PAIRS}.{n}.decoders"), block=None, fn=fn)


def with_pairs(pieces: list[Piece], model: nn.Module) -> list[Piece]:
    """`pieces` with each kept pair around its cut (the pieces as they are when the model has none).

    The two pieces lose their block index, so a stage runs them one by one, not as timm's whole block
    (the pieces compute timm's arithmetic op for op, so nothing else changes)."""
    out = list(pieces)
    for n, cut in enumerate(getattr(model, "wire_pair_cuts", [])):
        at = next((i for i, p in enumerate(out) if cut == p.name or cut in p.aliases), None)
        if not at:
            raise BadInput(f"the model's compressor sits at '{cut}', which is not a cut of this model")
        out[at - 1], out[at] = _encoding(out[at - 1], n), _decoding(out[at], n)
    return out


def whole_forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The whole model's forward: timm's own, or its pieces in order: with kept pairs (pairs included), and for a
    Hugging Face classifier (the pieces the pipeline runs, without masks)."""
    if is_encoder_classifier(model):  # (its own forward returns an output object, and masks)
        pieces = text_pieces(model)
        return lambda x: run_pieces(pieces, model, x)
    if not hasattr(model, PAIRS):
        return model
    pieces = with_pairs(vit_pieces(model), model)  # type: ignore[arg-type]  (a model with pairs is a ViT here)
    return lambda x: run_pieces(pieces, model, x)


def run_pieces(pieces: list[Piece], model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The whole model's forward as its pieces in order (a model with kept pairs, run serially)."""
    state: State = (x,)
    for piece in pieces:
        state = piece.fn(model, state)
    return state[0]
