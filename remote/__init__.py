"""Code that runs on the cluster hosts.

    floor/       the torch-free floor, the only part the controller imports: the contracts (event
                 names, records, the run spec, errors, wire formats, entry points, torch versions), the
                 split solver with its refinement and re-cuts, paths opened without following links
    data/        images and labelled sets (synthetic, CIFAR, ImageFolder)
    toolkit/     the model as pieces, split points, stage-local building, artifacts, numerics, the codec
    runtime/     the inference pipeline: the torchrun entry, the serial and plan runners, refinement
    profiling/   what `balanced` measures: per-piece costs, links
    pruning/     torch-pruning and fine-tuning (`pictl prune`)
    host/        housekeeping, stdlib only: supervise, cleanup, leases, provisioning, the probe; and the
                 warm process, which imports torch once so jobs start warm

Only the floor may be imported by the controller; everything else may import torch.
"""

from __future__ import annotations

from pathlib import Path


def source(relative: str) -> str:
    """The text of a stdlib-only module under remote/ (e.g. "host/probe.py"), sent to a host as
    `python -c SOURCE` so it runs before any code is pushed there."""
    return (Path(__file__).resolve().parent / relative).read_text()
