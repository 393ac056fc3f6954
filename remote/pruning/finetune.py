"""Top-1 evaluation and fine-tuning (SGD with momentum or AdamW, cosine schedule), keeping the best epoch."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from remote.floor.errors import BadInput
from remote.floor.spec import PruneSpec


def loader(ds: Dataset, batch_size: int, *, shuffle: bool, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=g, num_workers=0)


@torch.no_grad()
def top1(model: nn.Module, data: DataLoader, device: torch.device) -> float:
    was_training = model.training
    model.eval()
    right = seen = 0
    for images, labels in data:
        pred = model(images.to(device)).argmax(dim=-1).cpu()
        right += int((pred == labels).sum())
        seen += len(labels)
    model.train(was_training)
    return right / max(seen, 1)


def make_optimizer(model: nn.Module, spec: PruneSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum,
                               weight_decay=spec.weight_decay, nesterov=spec.momentum > 0)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    raise BadInput(f"optimizer '{spec.optimizer}': use sgd or adamw")


Progress = Callable[[int, int, int, float, float], None]
"""(epoch, step, steps, mean loss so far, images per second)."""
EpochDone = Callable[[int, float, float], None]
"""(epoch, top-1, seconds)."""


def finetune(model: nn.Module, train: DataLoader, test: DataLoader, spec: PruneSpec, device: torch.device,
             *, start_top1: float, on_progress: Progress, on_epoch: EpochDone) -> tuple[float, int]:
    """Train for `spec.epochs`; leave the model holding its best epoch. Returns (best top-1, best epoch).

    Epoch 0 is the model as it came in (right after pruning): if no epoch beats it,
    fine-tuning has made things worse and the untouched weights are kept.
    """
    best, best_epoch = start_top1, 0
    best_state = copy.deepcopy(model.state_dict()) if spec.epochs else None
    opt = make_optimizer(model, spec)
    steps = len(train)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, spec.epochs * steps))
    for epoch in range(1, spec.epochs + 1):
        model.train()
        started = time.perf_counter()
        loss_sum, seen, last_report = 0.0, 0, 0.0
        for step, (images, labels) in enumerate(train, 1):
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(labels)
            seen += len(labels)
            now = time.perf_counter()
            if now - last_report >= spec.progress_interval_s or step == steps:
                last_report = now
                on_progress(epoch, step, steps, loss_sum / seen, seen / (now - started))
        acc = top1(model, test, device)
        on_epoch(epoch, acc, time.perf_counter() - started)
        if acc > best:
            best, best_epoch = acc, epoch
            best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    return best, best_epoch
