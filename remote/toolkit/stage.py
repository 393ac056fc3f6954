"""One pipeline stage as an nn.Module holding only its own weights."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from remote.data.images import takes_token_ids
from remote.floor.spec import RunSpec
from remote.floor.wire import parse_wire
from remote.toolkit.artifact import meta_model_for
from remote.toolkit.cnn_pieces import pieces_for
from remote.toolkit.codec import Codec, learned_pair
from remote.toolkit.kept_pair import with_pairs
from remote.toolkit.model import Checkpoint, materialize, prune_to
from remote.toolkit.numerics import apply_numerics
from remote.toolkit.partition import StagePlan, plan
from remote.toolkit.pieces import Piece, PieceFn, block_piece_count


@dataclass
class ModelLayout:
    """The meta model, its pieces and the run's stages: cheap, no weights."""

    meta_model: nn.Module
    pieces: list[Piece]
    stages: list[StagePlan]

    @property
    def input_size(self) -> tuple[int, ...]:
        return tuple(self.meta_model.pretrained_cfg.get("input_size", (3, 224, 224)))  # type: ignore[return-value]

    @property
    def input_dtype(self) -> torch.dtype:
        """Images are floats; a text model's inputs are token ids."""
        return torch.long if takes_token_ids(self.meta_model.pretrained_cfg) else torch.float32

    def input_meta(self, batch: int) -> torch.Tensor:
        """One microbatch of the model's input, as a meta tensor."""
        return torch.empty((batch, *self.input_size), dtype=self.input_dtype, device="meta")


def layout_for(spec: RunSpec) -> ModelLayout:
    meta = meta_model_for(spec)
    pieces = with_pairs(pieces_for(meta, spec.model), meta)  # a trained model's kept compressor pairs, if any
    stages = plan(pieces, meta, stages=spec.stages, policy=spec.policy, split_points=spec.split_points,
                  model_name=f"model '{spec.model}'")
    return ModelLayout(meta, pieces, stages)


def _whole_block_at(pieces: list[Piece], i: int) -> int | None:
    """The block index if pieces[i:] begins with every piece of one block, else None."""
    blk = pieces[i].block
    run = pieces[i:i + block_piece_count()]
    whole = (blk is not None and pieces[i].name == f"blocks.{blk}" and len(run) == block_piece_count()
             and all(p.block == blk for p in run))
    return blk if whole else None


def _grouped(pieces: list[Piece]) -> Iterator[tuple[int | None, Piece]]:
    """The pieces in order, a block held whole once as (its index, its first piece), any other as (None, it)."""
    i = 0
    while i < len(pieces):
        blk = _whole_block_at(pieces, i)
        yield blk, pieces[i]
        i += block_piece_count() if blk is not None else 1


def _ops(pieces: list[Piece]) -> list[PieceFn]:
    """The stage's forward steps; a block held whole runs as timm's own Block.forward."""
    return [piece.fn if blk is None else (lambda m, s, b=blk: (m.blocks[b](s[0]),))
            for blk, piece in _grouped(pieces)]


class StageModule(nn.Module):
    """Runs pieces [first, end) of the model; takes and returns the state tensors."""

    def __init__(self, model: nn.Module, pieces: list[Piece], codec: Codec | None = None) -> None:
        super().__init__()
        self.model = model
        self.piece_names = [p.name for p in pieces]
        self._ops = _ops(pieces)
        self.codec = codec
        """Decodes what arrives and encodes what leaves (`--wire`); None: fp32 both ways, nothing counted."""
        if codec is not None and codec.encoders is not None:  # convinsert's layers train with the stage's
            self.wire_encoders = codec.encoders
        if codec is not None and codec.decoders is not None:
            self.wire_decoders = codec.decoders
        self.checkpointed = False
        """Training: each piece's activations are recomputed in the backward pass, not kept (only its input
        is). Non-reentrant checkpointing: it keeps the autocast state and works under the pipeline schedules;
        a BatchNorm's running statistics are updated again by the recomputation."""

    def forward(self, *state: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.codec is not None:
            state = self.codec.decode(state)
        recompute = self.checkpointed and torch.is_grad_enabled()
        for op in self._ops:
            state = checkpoint(op, self.model, state, use_reentrant=False) if recompute else op(self.model, state)
        if self.codec is not None:
            state = self.codec.encode(state)
        # What leaves a stage is sent whole: gloo sends contiguous tensors only, and a ConvNeXt block ends on a
        # permuted view (its norm and MLP run channels-last). A tensor that is contiguous is returned as it is.
        state = tuple(t.contiguous() for t in state)
        return state[0] if len(state) == 1 else state


def stage_modules(layout: ModelLayout, stage: StagePlan) -> list[str]:
    """Every module and parameter name the stage materialises."""
    pieces = layout.pieces[stage.first:stage.end]
    return sorted({m for p in pieces for m in p.modules})


def compact_pieces(pieces: list[Piece]) -> list[str]:
    """Readable stage contents: a block held whole is `blocks.i`, a partial one lists its pieces."""
    out: list[str] = []
    for blk, piece in _grouped(pieces):
        if blk is not None:
            out.append(f"blocks.{blk}")
        else:
            name, part_of = piece.name, piece.block
            out.append(f"{name}.norm1" if part_of is not None and name == f"blocks.{part_of}" else name)
    return out


def build_stage(spec: RunSpec, layout: ModelLayout, stage: StagePlan,
                checkpoint: Checkpoint | None, codec: Codec | None = None) -> StageModule:
    """Materialise one stage: only its own modules ever get memory."""
    model = copy.deepcopy(layout.meta_model)  # meta: copying costs no weight memory
    prune_to(model, stage_modules(layout, stage))
    materialize(model, seed=spec.seed, checkpoint=checkpoint)
    apply_numerics(model, getattr(spec, "numerics", "fp32"))  # (a training job's stages stay fp32)
    return StageModule(model, layout.pieces[stage.first:stage.end], codec).eval()


def stage_codec(spec: RunSpec, layout: ModelLayout, rank: int) -> Codec:
    """Rank `rank`'s wire formats: the cut it receives at (where it begins) and the one it sends to."""
    wire = parse_wire(spec.wire)
    stages = layout.stages
    fmt_in = wire.at(layout.pieces[stages[rank].first].name) if rank > 0 else None
    fmt_out = wire.at(layout.pieces[stages[rank + 1].first].name) if rank < len(stages) - 1 else None
    # lowrank sends a feature map (B, C, H, W) as factors of (B, C, H*W): the receiver restores H and W.
    learned = [f for f in (fmt_in, fmt_out) if f is not None and f.learned]
    shapes = stage_io_shapes(layout, 1)[rank] if learned or (fmt_in and fmt_in.kind in ("lowrank", "int8")) else None
    encoders = decoders = None
    if fmt_out is not None and fmt_out.learned and shapes:
        encoders = learned_pair(fmt_out, shapes[1], seed=spec.seed * 1000 + 2 * rank)[0]
    if fmt_in is not None and fmt_in.learned and shapes:
        decoders = learned_pair(fmt_in, shapes[0], seed=spec.seed * 1000 + 2 * rank + 1)[1]
    return Codec(fmt_in, fmt_out, shapes[0] if shapes and fmt_in else None, encoders=encoders, decoders=decoders,
                 feedback=getattr(spec, "error_feedback", False))  # a training job's choice


def stage_io_shapes(layout: ModelLayout, batch: int) -> list[tuple[list[torch.Size], list[torch.Size]]]:
    """Input and output tensor shapes of every stage for a microbatch of `batch` images."""
    state: tuple[torch.Tensor, ...] = (layout.input_meta(batch),)
    shapes = []
    for stage in layout.stages:
        module = StageModule(layout.meta_model, layout.pieces[stage.first:stage.end])
        with torch.no_grad():
            out = module(*state)
        out = out if isinstance(out, tuple) else (out,)
        shapes.append(([t.shape for t in state], [t.shape for t in out]))
        state = out
    return shapes
