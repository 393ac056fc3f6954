"""Convolutional networks as ordered lists of pieces, each a place a stage may begin, and the one choice of a
model's pieces (`pieces_for`) that inference, training and profiling share.

CNNs are cut between their residual or inverted-residual blocks: timm's ResNets (`resnet18`, `resnet50`,
...) at `conv1`, `layerI.J` and the head; timm's MobileNet/EfficientNet family (`mobilenetv2_100`,
`efficientnet_b0`, ...) at `conv_stem`, `blocks.I.J`, `conv_head` and the head; MobileNetV3s at `conv_stem`,
`blocks.I.J` and the head; VGGs before each convolution (`features.N`) and before each of the head's two
fully-connected layers (`pre_logits`, `pre_logits.fc2`); ConvNeXts at `stem`, each stage (`stages.I`, its
downsampling with its first block) and block (`stages.I.blocks.J`) and the head (`norm_pre`); RegNets at `stem`,
`sI.bJ` and the head (`final_conv`).
Each piece runs timm's own modules in timm's order, so a split model computes what the whole one does, bit for
bit (tested). Between two pieces the pipeline carries one feature map: ResNet-50's after `layer1` is 256x56x56
floats (3.2 MB an image, DeiT-S's state is 0.3 MB), so where a CNN is cut is a question of the link as much as
of compute.
"""

from __future__ import annotations

from timm.models.convnext import ConvNeXt
from timm.models.efficientnet import EfficientNet
from timm.models.mobilenetv3 import MobileNetV3
from timm.models.regnet import RegNet
from timm.models.resnet import ResNet
from timm.models.vgg import VGG
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn import functional as F

from remote.floor.errors import BadInput
from remote.floor.spec import factory_of
from remote.toolkit.pieces import Piece, State, check_supported, vit_pieces
from remote.toolkit.text_models import is_encoder_classifier, text_pieces
from remote.toolkit.user_models import sequential_pieces

FAMILIES = ("timm ViTs (deit_*, deit3_*, vit_*)", "ResNets (resnet18, resnet50, ...)",
            "MobileNetV2/EfficientNets (mobilenetv2_100, efficientnet_b0, ...)", "MobileNetV3s (mobilenetv3_*)",
            "VGGs (vgg11, vgg16, ...)", "ConvNeXts (convnext_atto, ...)", "RegNets (regnetx_002, regnety_*, ...)",
            "Hugging Face encoder classifiers (hf:bert-base, hf:roberta-base, hf:/a/model/dir)",
            "your own nn.Sequential (package.module:factory)")
"""What pictl splits, as a refusal names it."""


def pieces_for(model: nn.Module, name: str) -> list[Piece]:
    """The model's forward pass, in order, as pieces; one line naming what pictl splits for any other model."""
    if isinstance(model, VisionTransformer):
        return vit_pieces(check_supported(model, name))
    if isinstance(model, ResNet):
        return resnet_pieces(model)
    if isinstance(model, EfficientNet):
        return efficientnet_pieces(model)
    if isinstance(model, MobileNetV3):
        return mobilenetv3_pieces(model)
    if isinstance(model, VGG):
        return vgg_pieces(model)
    if isinstance(model, ConvNeXt):
        return convnext_pieces(model)
    if isinstance(model, RegNet):
        return regnet_pieces(model)
    if is_encoder_classifier(model):
        return text_pieces(model)
    if isinstance(model, nn.Sequential) and factory_of(name):
        return sequential_pieces(model)
    raise BadInput(f"model '{name}' is a {type(model).__name__}; pictl splits {', '.join(FAMILIES)}")


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


def _head_after(name: str, modules: tuple[str, ...], alias: str) -> Piece:
    """The last piece: module `name` (a final norm or convolution), then timm's own `forward_head`."""

    def fn(m: nn.Module, s: State) -> State:
        return (m.forward_head(m.get_submodule(name)(s[0])),)  # type: ignore[operator]

    return Piece(name, (alias,), modules, None, fn)


def mobilenetv3_pieces(model: MobileNetV3) -> list[Piece]:
    def stem(m: nn.Module, s: State) -> State:
        return (m.bn1(m.conv_stem(s[0])),)  # type: ignore[operator]

    pieces = [Piece("conv_stem", (), ("conv_stem", "bn1"), None, stem)]
    for i, group in enumerate(model.blocks):
        for j in range(len(group)):
            piece = _step(f"blocks.{i}.{j}", (f"blocks.{i}.{j}",))
            pieces.append(Piece(piece.name, (f"blocks.{i}",) if j == 0 else (), piece.modules, None, piece.fn))
    pieces.append(_head("global_pool", ("global_pool", "conv_head", "norm_head", "act2", "flatten", "classifier"),
                        "conv_head"))
    return pieces


def vgg_pieces(model: VGG) -> list[Piece]:
    """One piece from each convolution to the next (its norm, activation and pooling with it), then the head."""
    layers = list(model.features)
    starts = [i for i, layer in enumerate(layers) if isinstance(layer, nn.Conv2d)]
    pieces = []
    for first, end in zip(starts, [*starts[1:], len(layers)], strict=True):
        names = tuple(f"features.{k}" for k in range(first, end))

        def fn(m: nn.Module, s: State, names: tuple[str, ...] = names) -> State:
            x = s[0]
            for n in names:
                x = m.get_submodule(n)(x)
            return (x,)

        pieces.append(Piece(names[0], (), names, None, fn))
    # The head is two pieces: its first fully-connected layer (a 7x7 convolution) holds 103 M of VGG-16's 138 M
    # weights and takes over half of a 224 px image's time on a 0.4-core host, so a pipeline that kept it with the
    # rest of the head could never run faster than that one piece. ConvMlp.forward's steps, in its order.
    def fc1(m: nn.Module, s: State) -> State:
        mlp, x = m.pre_logits, s[0]  # type: ignore[union-attr]
        if x.shape[-2] < mlp.input_kernel_size or x.shape[-1] < mlp.input_kernel_size:  # (timm keeps it >= 7x7)
            x = F.adaptive_avg_pool2d(x, (max(mlp.input_kernel_size, x.shape[-2]),
                                          max(mlp.input_kernel_size, x.shape[-1])))
        return (mlp.drop(mlp.act1(mlp.fc1(x))),)

    def fc2_and_head(m: nn.Module, s: State) -> State:
        mlp = m.pre_logits  # type: ignore[union-attr]
        return (m.head(mlp.act2(mlp.fc2(s[0]))),)  # type: ignore[operator]

    pieces.append(Piece("pre_logits", (), ("pre_logits.fc1", "pre_logits.act1", "pre_logits.drop"), None, fc1))
    pieces.append(Piece("pre_logits.fc2", ("head",), ("pre_logits.fc2", "pre_logits.act2", "head"), None,
                        fc2_and_head))
    return pieces


def convnext_pieces(model: ConvNeXt) -> list[Piece]:
    """A stage's downsampling travels with its first block (`stages.I`); every later block is a piece."""
    pieces = [_step("stem", ("stem",))]
    for i, stage in enumerate(model.stages):
        for j in range(len(stage.blocks)):
            block = f"stages.{i}.blocks.{j}"
            if j == 0:
                def first(m: nn.Module, s: State, i: int = i) -> State:
                    stage_i = m.get_submodule(f"stages.{i}")
                    return (stage_i.blocks[0](stage_i.downsample(s[0])),)

                pieces.append(Piece(f"stages.{i}", (f"stages.{i}.downsample",),
                                    (f"stages.{i}.downsample", block), None, first))
            else:
                piece = _step(block, (block,))
                pieces.append(piece)
    pieces.append(_head_after("norm_pre", ("norm_pre", "head"), "head"))
    return pieces


def regnet_pieces(model: RegNet) -> list[Piece]:
    pieces = [_step("stem", ("stem",))]
    for i in range(1, 5):
        stage = getattr(model, f"s{i}")
        for j, (name, _) in enumerate(stage.named_children()):
            piece = _step(f"s{i}.{name}", (f"s{i}.{name}",))
            pieces.append(Piece(piece.name, (f"s{i}",) if j == 0 else (), piece.modules, None, piece.fn))
    pieces.append(_head_after("final_conv", ("final_conv", "head"), "head"))
    return pieces
