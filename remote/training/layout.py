"""The model a training job trains, as pieces a pipeline stage may begin at (no weights yet).

ViTs reuse the inference pieces (`remote.toolkit.pieces`): a stage may begin at a block or inside one.
CNNs are cut between their residual or inverted-residual blocks: timm's ResNets (`resnet18`, `resnet50`,
...) at `conv1`, `layerI.J` and the head; timm's MobileNet/EfficientNet family (`mobilenetv2_100`, ...)
at `conv_stem`, `blocks.I.J`, `conv_head` and the head. Each piece runs timm's own modules in timm's
order, so a split model computes what the whole one does.
"""

from __future__ import annotations

from timm.models.efficientnet import EfficientNet
from timm.models.resnet import ResNet
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from remote.floor.errors import BadInput
from remote.floor.spec import TrainSpec
from remote.toolkit.artifact import meta_model_from_artifact
from remote.toolkit.model import create_meta_model
from remote.toolkit.partition import plan
from remote.toolkit.pieces import Piece, State, check_supported, vit_pieces
from remote.toolkit.stage import ModelLayout


def _step(name: str, modules: tuple[str, ...], run: nn.Module | None = None) -> Piece:
    """A piece that feeds the one state tensor through `run` (default: the module called `name`)."""

    def fn(m: nn.Module, s: State) -> State:
        return ((run if run is not None else m.get_submodule(name))(s[0]),)

    return Piece(name, (), modules, None, fn)


def _head(name: str, modules: tuple[str, ...], alias: str) -> Piece:
    def fn(m: nn.Module, s: State) -> State:
        return (m.forward_head(s[0]),)  # type: ignore[operator]

    return Piece(name, (alias,), modules, None, fn)


def resnet_pieces(model: ResNet) -> list[Piece]:
    def stem(m: nn.Module, s: State) -> State:
        return (m.maxpool(m.act1(m.bn1(m.conv1(s[0])))),)  # type: ignore[operator]

    pieces = [Piece("conv1", (), ("conv1", "bn1", "act1", "maxpool"), None, stem)]
    for li in range(1, 5):
        layer = getattr(model, f"layer{li}")
        for j in range(len(layer)):
            piece = _step(f"layer{li}.{j}", (f"layer{li}.{j}",))
            pieces.append(Piece(piece.name, (f"layer{li}",) if j == 0 else (), piece.modules, None, piece.fn))
    pieces.append(_head("global_pool", ("global_pool", "fc"), "fc"))
    return pieces


def efficientnet_pieces(model: EfficientNet) -> list[Piece]:
    def stem(m: nn.Module, s: State) -> State:
        return (m.bn1(m.conv_stem(s[0])),)  # type: ignore[operator]

    def head_conv(m: nn.Module, s: State) -> State:
        return (m.bn2(m.conv_head(s[0])),)  # type: ignore[operator]

    pieces = [Piece("conv_stem", (), ("conv_stem", "bn1"), None, stem)]
    for i, group in enumerate(model.blocks):
        for j in range(len(group)):
            piece = _step(f"blocks.{i}.{j}", (f"blocks.{i}.{j}",))
            pieces.append(Piece(piece.name, (f"blocks.{i}",) if j == 0 else (), piece.modules, None, piece.fn))
    pieces.append(Piece("conv_head", (), ("conv_head", "bn2"), None, head_conv))
    pieces.append(_head("global_pool", ("global_pool", "classifier"), "classifier"))
    return pieces


def _meta_model(spec: TrainSpec) -> nn.Module:
    if spec.checkpoint and spec.checkpoint.endswith(".safetensors"):
        stored = meta_model_from_artifact(spec.checkpoint, model=spec.model, num_classes=spec.num_classes)
        if stored is not None:
            return stored
    kwargs = dict(spec.model_kwargs)
    model = create_meta_model(spec.model, spec.num_classes, **kwargs)
    if spec.image_size:
        if isinstance(model, VisionTransformer):
            if tuple(model.pretrained_cfg["input_size"][1:]) != (spec.image_size, spec.image_size):
                model = create_meta_model(spec.model, spec.num_classes, **{**kwargs, "img_size": spec.image_size})
        else:  # a CNN takes any size: only its input transform changes
            model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, spec.image_size, spec.image_size)}
    return model


def train_layout(spec: TrainSpec) -> ModelLayout:
    """The model's pieces and the stages of this job (one stage unless the mode is `pipeline`)."""
    meta = _meta_model(spec)
    if isinstance(meta, VisionTransformer):
        pieces = vit_pieces(check_supported(meta, spec.model))
    elif isinstance(meta, ResNet):
        pieces = resnet_pieces(meta)
    elif isinstance(meta, EfficientNet):
        pieces = efficientnet_pieces(meta)
    else:
        raise BadInput(f"model '{spec.model}' is a {type(meta).__name__}; pictl trains timm ViTs (deit_*, vit_*), "
                       "ResNets (resnet18, resnet50, ...) and MobileNet/EfficientNets (mobilenetv2_100, ...)")
    stages = spec.stages if spec.mode == "pipeline" else 1
    split = spec.split_points if spec.mode == "pipeline" else []
    return ModelLayout(meta, pieces, plan(pieces, meta, stages=stages, policy=spec.policy, split_points=split))


def layout_kwargs(spec: TrainSpec, layout: ModelLayout) -> dict:
    """The timm constructor arguments that rebuild the trained architecture (`pictl run --model FILE`)."""
    kwargs = dict(spec.model_kwargs)
    if spec.image_size and isinstance(layout.meta_model, VisionTransformer):
        kwargs.setdefault("img_size", spec.image_size)
    return kwargs
