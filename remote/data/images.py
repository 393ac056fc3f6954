"""Input images and labels: synthetic, CIFAR-10/100 (python-pickle layout), ImageFolder; a text model's
synthetic token ids.

The first stage needs the images, the last stage only the labels, so labels are
read without decoding any image. CIFAR's batches are shuffled, so a run takes the
first images; an ImageFolder is sorted by class, so a run takes images spread
evenly over it. CIFAR's files are pickles by format; they are read with an
unpickler that admits only the few numpy globals those files contain.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from remote.floor.errors import BadInput
from remote.floor.spec import DataSpec

_CIFAR = {
    "cifar10": {"dirs": ("", "cifar-10-batches-py"), "train": [f"data_batch_{i}" for i in range(1, 6)],
                "test": ["test_batch"], "label": b"labels"},
    "cifar100": {"dirs": ("", "cifar-100-python"), "train": ["train"], "test": ["test"],
                 "label": b"fine_labels"},
}
_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
}


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # what pickle resolves to
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _cifar_files(data: DataSpec) -> list[Path]:
    layout = _CIFAR[data.kind]
    if not data.path:
        raise BadInput(f"data kind '{data.kind}' needs a data path")
    root = Path(data.path).expanduser()
    if not root.is_dir():
        raise BadInput(f"data directory {root}: does not exist")
    if data.split not in ("train", "test"):
        raise BadInput(f"data split '{data.split}': use train or test")
    for sub in layout["dirs"]:
        files = [root / sub / name for name in layout[data.split]]
        if all(f.is_file() for f in files):
            return files
    wanted = ", ".join(layout[data.split])
    raise BadInput(f"data directory {root}: no {data.kind} '{data.split}' files ({wanted}) "
                   f"in it or in {layout['dirs'][1]}/")


def _read_cifar(data: DataSpec, count: int) -> tuple[torch.Tensor, list[int]]:
    images, labels = [], []
    for path in _cifar_files(data):
        try:
            with path.open("rb") as fh:
                batch = _DataOnlyUnpickler(fh, encoding="bytes").load()
            arr, lab = batch[b"data"], batch[_CIFAR[data.kind]["label"]]
        except Exception as exc:
            raise BadInput(f"data file {path}: not a {data.kind} batch ({exc})") from exc
        images.append(torch.from_numpy(arr.reshape(-1, 3, 32, 32)))
        labels.extend(int(x) for x in lab)
        if len(labels) >= count:
            break
    return torch.cat(images)[:count], labels[:count]


def _model_transform_cfg(model_cfg: dict) -> tuple[tuple[int, int], str, tuple, tuple]:
    size = tuple(model_cfg.get("input_size", (3, 224, 224))[1:])
    mode = model_cfg.get("interpolation", "bicubic")
    return size, mode, model_cfg.get("mean", (0.485, 0.456, 0.406)), model_cfg.get("std", (0.229, 0.224, 0.225))


def _upscale(raw: torch.Tensor, model_cfg: dict) -> torch.Tensor:
    """CIFAR 32x32 uint8 -> the model's input size and normalisation."""
    size, mode, mean, std = _model_transform_cfg(model_cfg)
    x = raw.float().div_(255.0)
    x = F.interpolate(x, size=size, mode=mode if mode in ("bilinear", "bicubic") else "bilinear",
                      align_corners=False)
    mean_t = torch.tensor(mean).view(1, 3, 1, 1)
    std_t = torch.tensor(std).view(1, 3, 1, 1)
    return (x - mean_t) / std_t


def _imagefolder(data: DataSpec):  # noqa: ANN202
    from torchvision.datasets import ImageFolder

    if not data.path or not Path(data.path).expanduser().is_dir():
        raise BadInput(f"data directory {data.path}: does not exist")
    try:
        return ImageFolder(str(Path(data.path).expanduser()))
    except (FileNotFoundError, RuntimeError) as exc:
        raise BadInput(f"data directory {data.path}: not an ImageFolder layout ({exc})") from exc


def _need(count: int, have: int, data: DataSpec) -> None:
    if have < count:
        raise BadInput(f"data set {data.path} has {have} images; {count} were asked for")


def takes_token_ids(model_cfg: dict) -> bool:
    """Whether a model's inputs are token ids (a text model's `pretrained_cfg` names its vocabulary), not images."""
    return "vocab_size" in model_cfg


TOKENS = "tokens"
"""A tokenized data set: a `.safetensors` file holding `input_ids` (inputs x tokens, integers) and, for accuracy,
`labels` (one integer per input)."""


def _token_file(data: DataSpec, count: int, model_cfg: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first `count` inputs of a tokenized file and their labels (None: it has none), checked against the
    model when `model_cfg` is given. Unpadded inputs only: pictl gives a text model no attention mask."""
    from safetensors import SafetensorError, safe_open

    path = Path(data.path or "").expanduser()
    if not data.path or not path.is_file():
        raise BadInput(f"data file {path}: does not exist (--data tokens takes a .safetensors file)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            names = set(fh.keys())
            if "input_ids" not in names:
                raise BadInput(f"data file {path}: no 'input_ids' tensor (it holds {', '.join(sorted(names))})")
            ids = fh.get_slice("input_ids")[:count]
            labels = fh.get_slice("labels")[:count] if "labels" in names else None
    except SafetensorError as exc:
        raise BadInput(f"data file {path}: not a readable safetensors file ({exc})") from None
    if ids.dim() != 2 or ids.is_floating_point():
        raise BadInput(f"data file {path}: 'input_ids' must be integers, inputs x tokens (is {ids.dtype}, "
                       f"{list(ids.shape)})")
    _need(count, ids.shape[0], data)
    if labels is not None and (labels.shape != (ids.shape[0],) or labels.is_floating_point()):
        raise BadInput(f"data file {path}: 'labels' must be one integer per input")
    if model_cfg is not None:
        (tokens,), vocab, pad = model_cfg["input_size"], int(model_cfg["vocab_size"]), int(model_cfg["pad_token_id"])
        if ids.shape[1] != tokens:
            raise BadInput(f"data file {path}: {ids.shape[1]} tokens per input; run it with --tokens {ids.shape[1]}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise BadInput(f"data file {path}: token ids outside the model's vocabulary of {vocab}")
        padded = (ids == pad).any(dim=1).nonzero()
        if len(padded):
            raise BadInput(f"data file {path}: input {int(padded[0])} holds the padding id {pad}; pictl runs "
                           "unpadded inputs (no attention mask): tokenize to one length without padding")
    return ids.long(), labels.long() if labels is not None else None


def synthetic_ids(count: int, cfg: dict, seed: int, *, first: int = 0) -> torch.Tensor:
    """`count` inputs of token ids (inputs first, first + 1, ...), input i depending on (seed, i) only; never the
    padding id (no masks)."""
    (tokens,), vocab, pad = cfg["input_size"], int(cfg["vocab_size"]), int(cfg["pad_token_id"])
    out = torch.empty((count, tokens), dtype=torch.long)
    for k in range(count):
        ids = torch.randint(vocab - 1, (tokens,), generator=torch.Generator().manual_seed(seed * 7919 + first + k))
        out[k] = ids + (ids >= pad).long()
    return out


def load_images(data: DataSpec, count: int, model_cfg: dict, seed: int) -> torch.Tensor:
    """`count` input images, shape (count, 3, H, W), normalised for the model (a text model's: token ids,
    shape (count, tokens))."""
    if takes_token_ids(model_cfg):
        if data.kind == TOKENS:
            return _token_file(data, count, model_cfg)[0]
        if data.kind != "synthetic":
            raise BadInput(f"data kind '{data.kind}' holds images; a text model takes token ids (synthetic or "
                           f"{TOKENS})")
        return synthetic_ids(count, model_cfg, seed)
    if data.kind == TOKENS:
        raise BadInput(f"data file {data.path} holds token ids; this model takes images")
    if data.kind == "synthetic":
        size = tuple(model_cfg.get("input_size", (3, 224, 224)))
        out = torch.empty((count, *size))
        for i in range(count):  # image i depends on (seed, i) only, never on batching
            out[i] = torch.randn(size, generator=torch.Generator().manual_seed(seed * 7919 + i))
        return out
    if data.kind in _CIFAR:
        raw, labels = _read_cifar(data, count)
        _need(count, len(labels), data)
        return _upscale(raw, model_cfg)
    if data.kind == "imagefolder":
        from timm.data import create_transform, resolve_data_config

        ds = _imagefolder(data)
        _need(count, len(ds), data)
        transform = create_transform(**resolve_data_config(pretrained_cfg=model_cfg))
        return torch.stack([transform(ds[i][0]) for i in spread(len(ds), count)])
    raise BadInput(f"unknown data kind '{data.kind}'")


def load_labels(data: DataSpec, count: int) -> torch.Tensor | None:
    """Labels of the first `count` images, or None for synthetic data (no accuracy)."""
    if data.kind == "synthetic":
        return None
    if data.kind == TOKENS:
        return _token_file(data, count)[1]
    if data.kind in _CIFAR:
        _, labels = _read_cifar(data, count)
    elif data.kind == "imagefolder":
        targets = list(_imagefolder(data).targets)
        _need(count, len(targets), data)
        labels = [targets[i] for i in spread(len(targets), count)]
    else:
        raise BadInput(f"unknown data kind '{data.kind}'")
    _need(count, len(labels), data)
    return torch.tensor(labels[:count])


def spread(total: int, count: int) -> list[int]:
    """Which `count` of an ImageFolder's `total` images a run takes: evenly spaced over the folder. It lists
    images class by class, so its first `count` would all be of the first classes (ImageNet's val/ holds 50
    per class: 48 images would all be class 0, and accuracy would be that one class's)."""
    return [i * total // count for i in range(count)]


def check_data(data: DataSpec, count: int) -> None:
    """Fail early, with one clear line, if the data cannot provide `count` labelled images."""
    load_labels(data, count)


def microbatches(images: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    """Split into microbatches of exactly `chunk` images, zero-padding the last one.

    torch.distributed.pipelining sizes its receive buffers from the first
    microbatch and silently corrupts a shorter last one; padding keeps every
    microbatch the same shape, and the padded rows are dropped from the output
    (ViT rows never mix, so real rows are unaffected).
    """
    out = list(images.split(chunk))
    short = chunk - out[-1].shape[0]
    if short:
        out[-1] = torch.cat([out[-1], out[-1].new_zeros((short, *out[-1].shape[1:]))])
    return out
