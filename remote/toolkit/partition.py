"""Where the stages begin: explicit split points or the `equal` policy.

Pure logic over the piece list; `plan()` is what every rank and the controller's
validation step compute, identically, from the same spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from remote.floor.errors import BadInput
from remote.toolkit.model import count_params
from remote.toolkit.pieces import Piece


@dataclass(frozen=True)
class StagePlan:
    index: int
    first: int
    """Index of the stage's first piece."""
    end: int
    """One past the stage's last piece."""
    pieces: tuple[str, ...]
    params: int


def _cut_names(pieces: list[Piece]) -> dict[str, int]:
    names: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        for name in (piece.name, *piece.aliases):
            names[name] = i
    return names


def valid_cuts(pieces: list[Piece]) -> str:
    """Where a stage may begin, as a refusal says it: a ViT's by pattern (it has hundreds), any other's by name."""
    if any(p.block is not None for p in pieces):
        return ("blocks.N, and inside a block blocks.N.attn, blocks.N.attn.proj, blocks.N.norm2, blocks.N.mlp, "
                "blocks.N.mlp.fc2; norm, head")
    return ", ".join(p.name for p in pieces[1:])


def resolve_split_points(pieces: list[Piece], points: list[str], model: nn.Module,
                         model_name: str = "the model") -> list[int]:
    """Piece indices where stages 2..N begin, validated, in order."""
    cuts = _cut_names(pieces)
    known = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    seen: dict[int, str] = {}
    for point in points:
        if point not in cuts:
            what = ("a module of " + model_name + " but not a place a stage can begin" if point in known
                    else "not a module of " + model_name)
            raise BadInput(f"split point '{point}' is {what}; its cuts: {valid_cuts(pieces)}")
        index = cuts[point]
        if index == 0:
            raise BadInput(f"split point '{point}' is where the model begins: the first stage would be empty")
        if index in seen:
            raise BadInput(f"split points '{seen[index]}' and '{point}' are the same place")
        seen[index] = point
    return sorted(seen)


def piece_params(pieces: list[Piece], model: nn.Module) -> list[int]:
    return [count_params(model, p.modules) for p in pieces]


def equal_split(sizes: list[int], stages: int) -> list[int]:
    """Cut points giving each stage about `total / stages` parameters.

    The semantics of PiPPy's `split_into_equal_size`: walk the pieces in order,
    filling a bucket up to `total // stages`; a piece that would overflow the bucket
    starts the next stage (a piece larger than the bucket on its own closes it).
    PiPPy may end up with more stages than asked; here the remainder joins the
    last stage so the count is exact.
    """
    if stages < 1:
        raise BadInput("stages must be at least 1")
    if stages > len(sizes):
        raise BadInput(f"{stages} stages asked for, but the model has only {len(sizes)} places to split")
    per_stage = sum(sizes) // stages
    cuts: list[int] = []
    bucket = 0
    for i, size in enumerate(sizes):
        if len(cuts) == stages - 1:
            break
        if bucket + size <= per_stage:
            bucket += size
        elif bucket == 0:
            if i + 1 < len(sizes):
                cuts.append(i + 1)  # this piece alone exceeds a stage: cut right after it
        else:
            cuts.append(i)
            bucket = size
    # Too few cuts (tiny trailing pieces): give each missing stage one piece from the end.
    nxt = len(sizes) - 1
    while len(cuts) < stages - 1:
        while nxt in cuts:
            nxt -= 1
        cuts.append(nxt)
        cuts.sort()
    return sorted(set(cuts))


def plan(pieces: list[Piece], model: nn.Module, *, stages: int, policy: str,
         split_points: list[str], model_name: str = "the model") -> list[StagePlan]:
    """The stages of a run. `model` may live on the meta device; `model_name` is what a refusal calls it."""
    if stages < 1:
        raise BadInput(f"stages must be at least 1 (got {stages})")
    if stages > len(pieces):
        raise BadInput(f"{stages} stages asked for, but {len(pieces)} is the most this model can be split into")
    sizes = piece_params(pieces, model)
    if split_points:
        cuts = resolve_split_points(pieces, split_points, model, model_name)
        if len(cuts) != stages - 1:
            raise BadInput(f"{len(cuts)} split points make {len(cuts) + 1} stages, but {stages} stages were asked for")
    elif policy == "equal":
        cuts = equal_split(sizes, stages)
    elif stages == 1:
        cuts = []
    else:
        raise BadInput(f"policy '{policy}' needs split points (--split) for {stages} stages")
    bounds = [0, *cuts, len(pieces)]
    return [
        StagePlan(s, bounds[s], bounds[s + 1], tuple(p.name for p in pieces[bounds[s]:bounds[s + 1]]),
                  sum(sizes[bounds[s]:bounds[s + 1]]))
        for s in range(stages)
    ]


def split_point_names(pieces: list[Piece], stage_plans: list[StagePlan]) -> list[str]:
    return [pieces[sp.first].name for sp in stage_plans[1:]]
