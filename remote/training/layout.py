"""The model a training job trains, as pieces a pipeline stage may begin at (no weights yet).

The pieces are inference's (`remote.toolkit.cnn_pieces.pieces_for`): a ViT may begin a stage at a block or
inside one, a CNN between its residual or inverted-residual blocks.
"""

from __future__ import annotations

from timm.models.vision_transformer import VisionTransformer
from torch import nn

from remote.floor.spec import TrainSpec
from remote.toolkit.artifact import meta_model_from_artifact
from remote.toolkit.cnn_pieces import pieces_for
from remote.toolkit.model import create_meta_model
from remote.toolkit.partition import plan
from remote.toolkit.stage import ModelLayout
from remote.toolkit.text_models import NO_DROPOUT, is_text_model
from remote.training.lora import check_lora


def _meta_model(spec: TrainSpec) -> nn.Module:
    if spec.checkpoint and spec.checkpoint.endswith(".safetensors"):
        stored = meta_model_from_artifact(spec.checkpoint, model=spec.model, num_classes=spec.num_classes)
        if stored is not None:
            return stored
    kwargs = dict(spec.model_kwargs)
    if is_text_model(spec.model):  # token ids, no image size; no dropout unless asked (the modes compare losses)
        return create_meta_model(spec.model, spec.num_classes, **{**NO_DROPOUT, **kwargs})  # type: ignore[arg-type]
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
    if spec.lora:
        check_lora(meta, spec.model)
    pieces = pieces_for(meta, spec.model)
    stages = spec.stages if spec.mode == "pipeline" else 1
    split = spec.split_points if spec.mode == "pipeline" else []
    return ModelLayout(meta, pieces, plan(pieces, meta, stages=stages, policy=spec.policy, split_points=split,
                                          model_name=f"model '{spec.model}'"))


def layout_kwargs(spec: TrainSpec, layout: ModelLayout) -> dict:
    """The timm constructor arguments that rebuild the trained architecture (`pictl run --model FILE`)."""
    kwargs = dict(spec.model_kwargs)
    if is_text_model(spec.model):  # the dropout it trained with is not the model: `pictl run` evaluates
        return {k: v for k, v in kwargs.items() if k not in NO_DROPOUT}
    if spec.image_size and isinstance(layout.meta_model, VisionTransformer):
        kwargs.setdefault("img_size", spec.image_size)
    return kwargs
