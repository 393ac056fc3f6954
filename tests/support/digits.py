"""scikit-learn's handwritten digits (shipped inside the package) as an ImageFolder.

1797 real 8x8 images of 10 classes: small enough to train a small ViT on a laptop
CPU in seconds, real enough that accuracy means something. Written as train/ and
test/ folders of PNGs (a seeded 80/20 split), the layout `pictl prune` reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_digits(root: Path, *, test_fraction: float = 0.2, seed: int = 0) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = int(len(order) * (1 - test_fraction))
    for split, idx in (("train", order[:cut]), ("test", order[cut:])):
        for i in idx:
            folder = root / split / str(int(digits.target[i]))
            folder.mkdir(parents=True, exist_ok=True)
            grey = (digits.images[i] * (255 / 16)).astype(np.uint8)
            Image.fromarray(np.stack([grey] * 3, axis=-1)).save(folder / f"{i}.png")
    return root
