"""Labelled train and test sets for fine-tuning and evaluating a pruned model.

CIFAR-10/100 come from their python-pickle files (read by `remote.data.images`'s data-only
unpickler) and are upscaled to the model's input per image; an ImageFolder needs a
`train/` and a `test/` (or `val/`) directory of class folders. `limit` takes a
seeded random subset, so a short run still sees every class. A split small enough
(256 MB of input tensors) is decoded once and kept in memory.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset

from remote.data.images import _CIFAR, _imagefolder, _read_cifar, _upscale
from remote.floor.errors import BadInput
from remote.floor.spec import DataSpec

SPLIT_DIRS = {"train": ("train",), "test": ("test", "val")}


class _Cifar(Dataset):
    def __init__(self, data: DataSpec, split: str, model_cfg: dict) -> None:
        raw, labels = _read_cifar(DataSpec(kind=data.kind, path=data.path, split=split), 10**9)
        self.raw, self.labels, self.cfg = raw, labels, model_cfg
        self.classes = 10 if data.kind == "cifar10" else 100

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return _upscale(self.raw[i:i + 1], self.cfg)[0], self.labels[i]


def _split_folder(data: DataSpec, split: str) -> Path:
    root = Path(data.path or "").expanduser()
    if not data.path or not root.is_dir():
        raise BadInput(f"data directory {data.path}: does not exist")
    folder = next((root / d for d in SPLIT_DIRS[split] if (root / d).is_dir()), None)
    if folder is None:
        raise BadInput(f"data directory {root}: an ImageFolder for training or pruning needs "
                       f"{' or '.join(d + '/' for d in SPLIT_DIRS[split])} with one folder per class")
    return folder


def _imagefolder_split(data: DataSpec, split: str, model_cfg: dict) -> Dataset:
    from timm.data import create_transform, resolve_data_config
    from torchvision.datasets import ImageFolder

    folder = _split_folder(data, split)
    try:
        ds = ImageFolder(str(folder), transform=create_transform(**resolve_data_config(pretrained_cfg=model_cfg)))
    except (FileNotFoundError, RuntimeError) as exc:
        raise BadInput(f"data directory {folder}: not an ImageFolder layout ({exc})") from exc
    ds.num_classes = len(ds.classes)  # type: ignore[attr-defined]
    return ds


CACHE_BYTES = 256 * 1024 * 1024


class _InMemory(Dataset):
    """A split decoded once: fine-tuning reads every image once per epoch, and decoding and resizing
    small images costs more than the small model they feed. Only when the whole split fits."""

    def __init__(self, ds: Dataset) -> None:
        first = ds[0][0]
        self.images = torch.empty((len(ds), *first.shape), dtype=first.dtype)
        self.labels = []
        for i in range(len(ds)):
            self.images[i], label = ds[i]
            self.labels.append(label)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], self.labels[i]


def labelled_set(data: DataSpec, split: str, model_cfg: dict, *, limit: int = 0, seed: int = 0) -> Dataset:
    """`split` ("train" or "test") of the data set, at most `limit` images (0: all)."""
    if data.kind in _CIFAR:
        ds: Dataset = _Cifar(data, split, model_cfg)
        classes = ds.classes
    elif data.kind == "imagefolder":
        ds = _imagefolder_split(data, split, model_cfg)
        classes = ds.num_classes
    else:
        raise BadInput(f"pruning needs labelled data (cifar10, cifar100 or imagefolder), not '{data.kind}'")
    if limit and limit < len(ds):
        order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
        ds = Subset(ds, order[:limit].tolist())
    if len(ds) and len(ds) * ds[0][0].numel() * 4 <= CACHE_BYTES:  # the eval transform is deterministic
        ds = _InMemory(ds)
    ds.num_classes = classes  # type: ignore[attr-defined]
    return ds


def class_count(data: DataSpec) -> int:
    """How many classes the data set has (for the classifier head)."""
    if data.kind == "cifar10":
        return 10
    if data.kind == "cifar100":
        return 100
    # The class folders alone: no transform (it needs the model's data config, which may not exist yet).
    return len(_imagefolder(replace(data, path=str(_split_folder(data, "train")))).classes)
