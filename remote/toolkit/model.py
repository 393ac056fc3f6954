"""Build a timm model without ever holding weights a stage does not run.

The model is created on the meta device (no storage), every module the stage does
not use is cut away, and only what is left is given real memory: either a seeded
per-parameter init (the same numbers on every host, whatever the split) or the
stage's own keys read from a checkpoint (`safetensors` reads just those tensors;
`.pth` is memory-mapped and opened with `weights_only=True`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from pathlib import Path

import timm
import torch
from torch import nn

from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec, factory_of
from remote.toolkit.text_models import create_text_model, is_text_model, restore_buffers
from remote.toolkit.user_models import create_factory_model

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


def create_meta_model(name: str, num_classes: int, *, tokens: int = RunSpec.tokens, **kwargs: object) -> nn.Module:
    """The model's structure with no weights behind it: a timm model (`kwargs` go to its constructor), a Hugging
    Face classifier (`hf:...`, `tokens` ids per input) or a user's own (`package.module:factory`)."""
    if is_text_model(name):
        return create_text_model(name, num_classes, tokens, **kwargs)
    if factory_of(name):
        return create_factory_model(name)
    if not timm.is_model(name):
        raise BadInput(f"unknown model '{name}' (timm has no such architecture)")
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    except TypeError as exc:  # a constructor argument the model does not take (`--model-arg`)
        raise BadInput(f"model '{name}': {exc}") from None
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size:  # timm keeps the pretrained 224 in the config even when img_size says otherwise
        model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, *img_size)}
    return model.eval()


def prune_to(model: nn.Module, keep: Iterable[str]) -> None:
    """Replace every module and parameter not named in `keep` (or under it) by nothing.

    After this, `model.state_dict()` holds exactly the kept tensors, under their
    original names, which is what makes stage-local checkpoint loading exact.
    """
    keep = set(keep)

    def needed(name: str) -> bool:
        return name in keep or any(k.startswith(name + ".") for k in keep)

    def walk(module: nn.Module, prefix: str) -> None:
        for pname in list(module._parameters):
            full = prefix + pname
            if module._parameters[pname] is not None and not needed(full):
                module._parameters[pname] = None
        for cname, child in list(module.named_children()):
            full = prefix + cname
            if full in keep:
                continue
            if needed(full):
                walk(child, full + ".")
            else:
                setattr(module, cname, nn.Identity())

    walk(model, "")


def seed_for(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def init_seeded(model: nn.Module, seed: int) -> None:
    """Deterministic random weights, each tensor seeded by its own name.

    Each parameter depends only on (seed, its name), so a stage that holds three
    blocks gets the same numbers as the whole model on the serial host.
    """
    for name, p in model.named_parameters():
        g = torch.Generator().manual_seed(seed_for(seed, name))
        if name.endswith("bias"):
            p.zero_()
        elif p.dim() == 1:  # norm scales, layer-scale gammas
            p.fill_(1.0)
        else:
            nn.init.trunc_normal_(p, std=0.02, generator=g)
    for module in model.modules():  # `to_empty` left BatchNorm's running statistics as garbage (CNNs)
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            module.reset_running_stats()


def _unwrap_state_dict(obj: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return obj.state_dict()
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
        if all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
    raise BadInput(f"checkpoint {path}: not a state dict of tensors")


class Checkpoint:
    """A checkpoint file opened lazily: names and shapes first, tensors on demand."""

    def __init__(self, path: str, *, allow_pickle: bool = False) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise BadInput(f"checkpoint {self.path}: no such file")
        self._safe = None
        self._tensors: dict[str, torch.Tensor] = {}
        if self.path.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                self._safe = safe_open(str(self.path), framework="pt", device="cpu")
            except Exception as exc:
                raise BadInput(f"checkpoint {self.path}: not a readable safetensors file ({exc})") from exc
        elif self.path.suffix in PICKLE_SUFFIXES:
            self._tensors = self._load_torch(allow_pickle)
        else:
            raise BadInput(f"checkpoint {self.path}: unknown format (use .safetensors or .pth)")

    def _load_torch(self, allow_pickle: bool) -> dict[str, torch.Tensor]:
        try:
            # mmap: tensors stay on disk until a stage copies its own ones out.
            obj = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            if not allow_pickle:
                raise BadInput(
                    f"checkpoint {self.path}: cannot be read as plain weights ({type(exc).__name__}); "
                    "if it is a whole pickled model you trust, pass --allow-pickle") from exc
            obj = torch.load(self.path, map_location="cpu", weights_only=False)  # opt-in only
        return _unwrap_state_dict(obj, self.path)

    def shape(self, key: str) -> tuple[int, ...] | None:
        if self._safe is not None:
            return tuple(self._safe.get_slice(key).get_shape()) if key in self._safe.keys() else None
        t = self._tensors.get(key)
        return tuple(t.shape) if t is not None else None

    def tensor(self, key: str) -> torch.Tensor:
        if self._safe is not None:
            return self._safe.get_tensor(key)
        return self._tensors[key]

    def check_fits(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Every expected tensor is present with the expected shape, or one clear error."""
        missing = [k for k in expected if self.shape(k) is None]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise BadInput(f"checkpoint {self.path}: missing {', '.join(missing[:3])}{more}")
        for key, shape in expected.items():
            got = self.shape(key)
            if got != shape:
                raise BadInput(f"checkpoint {self.path}: '{key}' has shape {list(got or ())}, "
                               f"the model expects {list(shape)}")


def expected_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@torch.no_grad()
def materialize(model: nn.Module, *, seed: int, checkpoint: Checkpoint | None) -> nn.Module:
    """Give the (pruned) meta model real memory and its weights."""
    model.to_empty(device="cpu")
    restore_buffers(model)
    if checkpoint is None:
        init_seeded(model, seed)
    else:
        checkpoint.check_fits(expected_shapes(model))
        for key, target in model.state_dict(keep_vars=True).items():
            target.copy_(checkpoint.tensor(key))
    return model.eval()


def count_params(model: nn.Module, names: Iterable[str]) -> int:
    """Parameters under the given module or parameter names (meta models work too)."""
    total = 0
    params = dict(model.named_parameters())
    for name in names:
        if name in params:
            total += params[name].numel()
            continue
        try:
            sub = model.get_submodule(name)
        except AttributeError:
            continue
        total += sum(p.numel() for p in sub.parameters())
    return total
