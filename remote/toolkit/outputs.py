"""What the last stage (or the serial run) leaves behind: accuracy and check logits."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from remote.floor.emit import Emitter
from remote.floor.run_records import Accuracy, Outputs
from remote.floor.spec import RunSpec
from remote.toolkit.model import Checkpoint
from remote.toolkit.text_models import weights_in


def open_checkpoint(spec: RunSpec) -> Checkpoint | None:
    """The run's weights: its checkpoint, or a Hugging Face model directory's safetensors; None: seeded."""
    path = spec.checkpoint or weights_in(spec.model)
    return Checkpoint(path, allow_pickle=spec.allow_pickle) if path else None


def write_logits(logits: torch.Tensor, name: str) -> Path:
    """Raw little-endian float32, row-major (images x classes), written atomically."""
    path = Path(name)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(logits.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    os.replace(tmp, path)
    return path


def report_outputs(emitter: Emitter, spec: RunSpec, check_logits: torch.Tensor,
                   predictions: torch.Tensor, labels: torch.Tensor | None, logits_file: str) -> None:
    path = write_logits(check_logits, logits_file)
    if labels is None:
        # Synthetic images have no labels: accuracy is not applicable, never a number.
        emitter.emit(Accuracy(applicable=False))
    else:
        correct = int((predictions == labels).sum())
        emitter.emit(Accuracy(applicable=True, correct=correct, total=int(labels.numel()),
                              top1=round(correct / labels.numel(), 6)))
    emitter.emit(Outputs(logits_file=str(path), logits_shape=list(check_logits.shape)))
