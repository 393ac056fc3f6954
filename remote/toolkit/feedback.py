"""Error feedback for a lossy link in pipeline training: each image's change is compressed, not its state.

Compressing a stage's activations afresh every step makes the same error at every epoch, and the model
trains on it. With feedback (as AQ-SGD does for activations: Wang et al., "Fine-tuning Language Models over
Slow Networks using Activation Compression with Guarantees", 2022), both ends of a cut keep, per training
image, the state the receiver last rebuilt for it; the sender compresses the difference from it, and both
add what was sent. The first epoch sends the states themselves; later ones send how far they moved, which
shrinks as the model converges, so the error left in the receiver's copy shrinks too instead of repeating.

Why per image and not per step (as PowerSGD keeps the residual of a gradient): successive steps carry other
images, and one image's residual added to another's state is noise. The cost is memory: one state per
training image on each side of the cut (`DeltaMemory.nbytes`). Only steps with gradients use it; evaluation
compresses the state itself on both ends.
"""

from __future__ import annotations

from collections import deque

import torch


class DeltaMemory:
    """One end's copy of what the receiver holds for each training image, in forward order per step."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[torch.Tensor, ...]] = {}
        self._pending: deque[list[int]] = deque()

    def expect(self, micro: list[list[int]]) -> None:
        """The images of this step's microbatches, in the order the schedule runs their forwards (every
        schedule runs forwards in microbatch order, on every rank)."""
        self._pending = deque(micro)

    def next_images(self) -> list[int] | None:
        """The images of the forward about to run; None when it is not a training step's (no gradient)."""
        if not torch.is_grad_enabled() or not self._pending:
            return None
        return self._pending.popleft()

    def base(self, images: list[int], state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The kept states of `images`, stacked like `state` (zeros for an image not yet sent)."""
        out = []
        for i, t in enumerate(state):
            rows = [self._kept[n][i] if n in self._kept else torch.zeros(t.shape[1:], dtype=t.dtype)
                    for n in images]
            out.append(torch.stack(rows))
        return tuple(out)

    def keep(self, images: list[int], rebuilt: tuple[torch.Tensor, ...]) -> None:
        detached = [t.detach() for t in rebuilt]
        for row, n in enumerate(images):
            self._kept[n] = tuple(t[row].clone() for t in detached)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for kept in self._kept.values() for t in kept)
