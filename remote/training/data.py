"""What a training job reads: labelled training and evaluation images, and which of them each step takes.

Every mode draws the same global batches: epoch e visits the training images in a seeded order, step k
of it takes the next `batch_size`, and microbatch m of a step is its m-th slice of `microbatch` images
(an incomplete last batch is left out). Synthetic data is labelled by a fixed random projection of each
image, so a model can learn it and a falling loss means something; its evaluation images are those a
`pictl run --data synthetic` with the same seed uses, so a trained checkpoint can be checked there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

from remote.data.datasets import _Cifar, _InMemory, labelled_set
from remote.data.images import synthetic_ids, takes_token_ids
from remote.floor.errors import BadInput
from remote.floor.spec import DataSpec, TrainSpec

SYNTHETIC_TRAIN_OFFSET = 1_000_000
"""Synthetic training image i is `load_images`' image i + this: never one of the evaluation images."""


def _synthetic_image(seed: int, i: int, size: tuple[int, ...]) -> torch.Tensor:
    # The same recipe as `remote.data.images.load_images`, so evaluation image i is the run's image i.
    return torch.randn(size, generator=torch.Generator().manual_seed(seed * 7919 + i))


class SyntheticSet(Dataset):
    """Seeded random images whose class is the argmax of a fixed projection of their 4x4 average pool."""

    def __init__(self, count: int, size: tuple[int, ...], num_classes: int, seed: int, offset: int) -> None:
        self.count, self.size, self.seed, self.offset = count, size, seed, offset
        g = torch.Generator().manual_seed(seed * 31 + 17)
        self.projection = torch.randn((num_classes, size[0] * 16), generator=g)
        self.labels = [self._label(self.image(i)) for i in range(count)]

    def image(self, i: int) -> torch.Tensor:
        return _synthetic_image(self.seed, self.offset + i, self.size)

    def _label(self, image: torch.Tensor) -> int:
        pooled = F.adaptive_avg_pool2d(image.unsqueeze(0), 4).flatten()
        return int((self.projection @ pooled).argmax())

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.image(i), self.labels[i]


class SyntheticTokens(Dataset):
    """Seeded token ids (those `remote.data.images.load_images` makes for input i) whose class is the argmax of
    a fixed projection of their bag of words, hashed into 64 buckets: a model can learn it from the ids."""

    BUCKETS = 64

    def __init__(self, count: int, model_cfg: dict, num_classes: int, seed: int, offset: int) -> None:
        self.count, self.cfg, self.seed, self.offset = count, model_cfg, seed, offset
        g = torch.Generator().manual_seed(seed * 31 + 17)
        self.projection = torch.randn((num_classes, self.BUCKETS), generator=g)
        self.labels = [self._label(self.image(i)) for i in range(count)]

    def image(self, i: int) -> torch.Tensor:
        return synthetic_ids(1, self.cfg, self.seed, first=self.offset + i)[0]

    def _label(self, ids: torch.Tensor) -> int:
        bag = torch.bincount(ids % self.BUCKETS, minlength=self.BUCKETS).float()
        return int((self.projection @ bag).argmax())

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.image(i), self.labels[i]


def _labels(ds: Dataset) -> list[int]:
    """Every label of `ds`, without decoding an image where the data set allows it."""
    if isinstance(ds, SyntheticSet | SyntheticTokens | _InMemory | _Cifar):
        return list(ds.labels)
    if isinstance(ds, Subset):
        inner = _labels(ds.dataset)
        return [inner[i] for i in ds.indices]
    targets = getattr(ds, "targets", None)  # ImageFolder
    if targets is not None:
        return list(targets)
    return [int(ds[i][1]) for i in range(len(ds))]  # type: ignore[arg-type]


@dataclass
class Labelled:
    """One split: images fetched by index, labels held in full."""

    images: Dataset
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, indices: list[int]) -> torch.Tensor:
        return torch.stack([self.images[i][0] for i in indices])


class _ImagesOnly(Dataset):
    def __init__(self, images: Dataset) -> None:
        self.images = images

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i][0]


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)  # a loader process shares the host's cores with the rank: it must not fan out


class Prefetched(Labelled):
    """A rank's training images for all of its steps, read ahead by `workers` processes (torch's DataLoader,
    two batches each) in the order the steps will ask for them; `take` hands over the next batch, and refuses
    one asked for out of that order (it would be another step's images)."""

    def __init__(self, split: Labelled, order: list[list[int]], workers: int) -> None:
        super().__init__(split.images, split.labels)
        self.order, self.next = order, 0
        self._batches = iter(DataLoader(_ImagesOnly(split.images), batch_sampler=order, num_workers=workers,
                                        collate_fn=torch.stack, worker_init_fn=_one_thread, prefetch_factor=2))

    def take(self, indices: list[int]) -> torch.Tensor:
        if self.next >= len(self.order) or list(indices) != self.order[self.next]:
            raise RuntimeError(f"prefetched batch {self.next} is not the one asked for")
        self.next += 1
        return next(self._batches)


def labelled(spec: TrainSpec, split: str, count: int, model_cfg: dict) -> Labelled:
    """`count` images of `split` ("train" or "test"); synthetic data is made, the others read."""
    if count <= 0:
        return Labelled(SyntheticSet(0, (3, 1, 1), 1, 0, 0), torch.zeros(0, dtype=torch.long))
    if takes_token_ids(model_cfg):
        if spec.data.kind != "synthetic":
            raise BadInput(f"data kind '{spec.data.kind}' holds images; a text model trains on synthetic token ids")
        ds = SyntheticTokens(count, model_cfg, spec.num_classes, spec.seed,
                             SYNTHETIC_TRAIN_OFFSET if split == "train" else 0)
    elif spec.data.kind == "synthetic":
        size = tuple(model_cfg.get("input_size", (3, 224, 224)))
        ds: Dataset = SyntheticSet(count, size, spec.num_classes, spec.seed,
                                   SYNTHETIC_TRAIN_OFFSET if split == "train" else 0)
    else:
        ds = labelled_set(DataSpec(kind=spec.data.kind, path=spec.data.path), split, model_cfg,
                          limit=count, seed=spec.seed)
        classes = getattr(ds, "num_classes", spec.num_classes)
        if classes != spec.num_classes:
            raise BadInput(f"data set {spec.data.path} has {classes} classes; the model is built with "
                           f"{spec.num_classes} (--num-classes)")
    if len(ds) < count and spec.data.kind != "synthetic":
        count = len(ds)
    return Labelled(ds, torch.tensor(_labels(ds)[:count], dtype=torch.long))


@dataclass(frozen=True)
class Batches:
    """Which training images each step takes: the same in every mode."""

    images: int
    batch_size: int
    microbatch: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return self.images // self.batch_size

    def step(self, step: int) -> list[list[int]]:
        """Global step `step` (from 0): its microbatches' image indices."""
        epoch, k = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.images, generator=torch.Generator().manual_seed(self.seed * 1_000 + epoch))
        chosen = order[k * self.batch_size:(k + 1) * self.batch_size].tolist()
        return [chosen[i:i + self.microbatch] for i in range(0, self.batch_size, self.microbatch)]


def padded_microbatches(indices: list[int], size: int, per_batch: int) -> list[list[int | None]]:
    """`indices` as microbatches of `size`, grouped so a batch holds `per_batch` of them; the gaps of the
    last (None) are padding (zero images whose rows are dropped)."""
    total = -(-len(indices) // (size * per_batch)) * size * per_batch
    filled: list[int | None] = [*indices, *[None] * (total - len(indices))]
    return [filled[i:i + size] for i in range(0, total, size)]


def take_padded(split: Labelled, indices: list[int | None]) -> torch.Tensor:
    real = [i for i in indices if i is not None]
    images = split.take(real) if real else None
    shape = images.shape[1:] if images is not None else split.images[0][0].shape
    out = torch.zeros((len(indices), *shape), dtype=images.dtype if images is not None else split.images[0][0].dtype)
    if images is not None:
        out[: len(real)] = images
    return out
