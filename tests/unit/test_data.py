"""Data sources: synthetic determinism, CIFAR layout and safety, ImageFolder, padding."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from support.cifar import write_cifar10

from remote.data.images import load_images, load_labels, microbatches
from remote.floor.errors import BadInput
from remote.floor.spec import DataSpec

CFG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}


def test_synthetic_images_do_not_depend_on_count() -> None:
    a = load_images(DataSpec(), 5, CFG, seed=1)
    b = load_images(DataSpec(), 3, CFG, seed=1)
    assert a.shape == (5, 3, 224, 224) and torch.equal(a[:3], b)
    assert not torch.equal(a, load_images(DataSpec(), 5, CFG, seed=2))
    assert load_labels(DataSpec(), 5) is None  # no labels: accuracy is not applicable


def test_cifar10_layout(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path, images=6)
    spec = DataSpec(kind="cifar10", path=str(root))
    x = load_images(spec, 4, CFG, seed=0)
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.float32
    labels = load_labels(spec, 4)
    assert labels is not None and labels.shape == (4,) and int(labels.max()) < 10
    with pytest.raises(BadInput, match="has 6 images; 10 were asked for"):
        load_labels(spec, 10)


def test_cifar_refuses_code_in_pickles(tmp_path: Path) -> None:
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (base / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": [1]}))
    with pytest.raises(BadInput, match="refusing to load builtins.print"):
        load_labels(DataSpec(kind="cifar10", path=str(tmp_path)), 1)


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "no cifar10 'test' files"),
])
def test_cifar_bad_directories(tmp_path: Path, setup, message: str) -> None:
    setup(tmp_path / "d")
    with pytest.raises(BadInput, match=message):
        load_labels(DataSpec(kind="cifar10", path=str(tmp_path / "d")), 1)


def test_imagefolder(tmp_path: Path) -> None:
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (40, 30), color=(i * 90, 20, 200)).save(tmp_path / cls / f"{i}.png")
    spec = DataSpec(kind="imagefolder", path=str(tmp_path))
    assert load_labels(spec, 4).tolist() == [0, 0, 1, 1]
    # Fewer images than the folder holds: spread over every class, not the first class's images.
    assert load_labels(spec, 2).tolist() == [0, 1]
    assert torch.equal(load_images(spec, 2, CFG, seed=0), load_images(spec, 4, CFG, seed=0)[::2])
    assert load_images(spec, 3, CFG, seed=0).shape == (3, 3, 224, 224)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="not an ImageFolder layout"):
        load_labels(DataSpec(kind="imagefolder", path=str(tmp_path / "empty")), 1)


def test_uneven_microbatches_are_padded_to_the_chunk() -> None:
    mbs = microbatches(torch.arange(10.0).view(10, 1), 4)
    assert [m.shape[0] for m in mbs] == [4, 4, 4]
    assert mbs[2].view(-1).tolist() == [8.0, 9.0, 0.0, 0.0]


def test_cifar_train_and_test_splits_for_pruning(tmp_path: Path) -> None:
    from remote.data.datasets import labelled_set

    root = write_cifar10(tmp_path / "full", images=4, train_batches=5)
    spec = DataSpec(kind="cifar10", path=str(root))
    train, test = labelled_set(spec, "train", CFG), labelled_set(spec, "test", CFG, limit=3)
    assert (len(train), len(test), train.num_classes) == (20, 3, 10)
    image, label = train[0]
    assert image.shape == (3, 224, 224) and 0 <= label < 10
    # Only the test batch: fine-tuning has nothing to learn from, and says which files are missing.
    with pytest.raises(BadInput, match="no cifar10 'train' files"):
        labelled_set(DataSpec(kind="cifar10", path=str(write_cifar10(tmp_path / "test-only"))), "train", CFG)
    with pytest.raises(BadInput, match="pruning needs labelled data"):
        labelled_set(DataSpec(), "train", CFG)


def test_a_model_the_pruner_cannot_handle_is_named() -> None:
    from remote.toolkit.model import create_meta_model
    from remote.toolkit.pieces import check_supported

    with pytest.raises(BadInput, match="resnet18"):
        check_supported(create_meta_model("resnet18", 10), "resnet18")


def test_an_imagefolder_counts_its_classes_before_any_model_exists(tmp_path: Path) -> None:
    """`pictl train --data imagefolder` sizes the head from the class folders, before it knows the model's
    input transform (building one without a model config failed inside timm)."""
    from PIL import Image

    from remote.data.datasets import class_count

    for cls in ("a", "b", "c"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "train" / cls / "0.png")
    assert class_count(DataSpec(kind="imagefolder", path=str(tmp_path))) == 3
    with pytest.raises(BadInput, match="needs train/"):
        class_count(DataSpec(kind="imagefolder", path=str(tmp_path / "train")))
