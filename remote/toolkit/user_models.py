"""A user's own model: `--model package.module:factory`, a function in code pushed beside `remote/` that returns
the model and an example input.

The factory is called with no arguments on the meta device, so no host ever holds weights a stage does not run:
its model's structure and its example's shape (one input per row) are all pictl takes from it. Weights are then
seeded by name like any other model's, or read from `--checkpoint`. Where the model may be cut: a model of a
family pictl splits (a timm ViT or CNN the factory configured) keeps that family's cuts; an `nn.Sequential`
is cut between its children (`0`, `1`, ...), each run as its own forward; anything else is refused with one
line, since pictl cannot know where its forward may be divided.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from remote.floor.errors import BadInput
from remote.floor.spec import factory_of
from remote.toolkit.pieces import Piece


def create_factory_model(name: str) -> nn.Module:
    """The model the factory returns, on the meta device, with `pretrained_cfg` saying what one input is."""
    named = factory_of(name)
    if named is None:
        raise BadInput(f"model '{name}': not package.module:factory")
    module_name, function = named
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"model '{name}': cannot import {module_name} on this host ({exc})") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise BadInput(f"model '{name}': {module_name} has no function {function}")
    try:
        with torch.device("meta"):
            made: Any = factory()
    except Exception as exc:  # the user's code: whatever it raises is its own fault, said in one line
        raise BadInput(f"model '{name}': the factory failed on the meta device "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)
            and isinstance(made[1], torch.Tensor)):
        raise BadInput(f"model '{name}': the factory must return (model, example input), a Module and a Tensor")
    model, example = made
    if not example.is_floating_point() or example.dim() < 2:
        raise BadInput(f"model '{name}': its example input is {example.dtype} of shape {list(example.shape)}; "
                       "pictl feeds floating-point inputs, one per row (batch first)")
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    model.pretrained_cfg = {**cfg, "input_size": tuple(example.shape[1:])}
    return model.eval()


def sequential_pieces(model: nn.Sequential) -> list[Piece]:
    """An nn.Sequential's children in order, each a piece (its own forward)."""
    def step(i: int) -> Piece:
        return Piece(str(i), (), (str(i),), None, lambda m, s: (m[i](s[0]),))  # type: ignore[index]

    return [step(i) for i in range(len(model))]
