"""A tiny data set in CIFAR-10's real python-pickle layout, written by the tests."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def write_cifar10(root: Path, images: int = 6, *, train_batches: int = 0) -> Path:
    """A test batch of `images` images, and `train_batches` training batches of as many (0: none)."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = ["test_batch"] + [f"data_batch_{i}" for i in range(1, train_batches + 1)]
    for name in names:
        batch = {b"data": rng.integers(0, 256, size=(images, 3072), dtype=np.uint8),
                 b"labels": [int(x) for x in rng.integers(0, 10, size=images)],
                 b"batch_label": name.encode(), b"filenames": [b"x.png"] * images}
        with (base / name).open("wb") as fh:
            pickle.dump(batch, fh, protocol=2)
    return root
