"""Hugging Face encoder classifiers (BERT, RoBERTa, XLM-RoBERTa, ELECTRA) as ordered lists of pieces, built on
the meta device like every other model pictl splits.

A text model is named `hf:bert-base` or `hf:roberta-base` (the architecture's published base sizes, seeded
random weights) or `hf:DIR`: a directory on the hosts with a `config.json` (as `save_pretrained` writes it) and,
when there is one, its `model.safetensors` (pickles are never read). Its classifier has `num_classes` outputs.

Each input is `tokens` token ids; the pipeline carries the hidden states (B, tokens, hidden) between stages, as
it carries a ViT's tokens. A stage may begin at the embeddings, at each layer (`<base>.encoder.layer.N`), inside
a layer after its attention (`....N.intermediate`) or before its output projection (`....N.output`, then the
state is the intermediate activations and the attention output the residual adds back), and at the head
(`classifier`). Each piece calls the layer's own modules in the order its `forward` does, without an attention
mask (synthetic ids have no padding), so the split model and the serial run compute the same numbers bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from remote.floor.errors import BadInput
from remote.floor.spec import HF_PREFIX, hf_model_dir
from remote.toolkit.pieces import Piece, State

if TYPE_CHECKING:  # (transformers is imported where it is used: a 2-3 s import)
    from transformers import PretrainedConfig

ENCODERS = ("bert", "roberta", "xlm-roberta", "electra")
"""The `model_type`s whose classifier pictl cuts: an embeddings module, `encoder.layer`, a classification head."""
BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "bert-base": {"model_type": "bert"},  # BertConfig's defaults are BERT-base's sizes
    "roberta-base": {"model_type": "roberta", "vocab_size": 50265, "max_position_embeddings": 514,
                     "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0,
                     "eos_token_id": 2},
}
"""The architectures `hf:NAME` builds with no directory, with their published sizes."""
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0}
"""What training sets (unless asked otherwise): every mode then computes the same numbers, as timm's models do
with their default drop rates of 0."""
WEIGHTS = "model.safetensors"


def is_text_model(name: str) -> bool:
    return name.startswith(HF_PREFIX)


def _config(name: str, num_classes: int, overrides: dict[str, Any]) -> PretrainedConfig:
    from transformers import AutoConfig

    what = name[len(HF_PREFIX):]
    if what in BASE_CONFIGS:
        settings = dict(BASE_CONFIGS[what])
        config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    else:
        path = Path(what).expanduser()
        if not path.is_absolute() or not (path / "config.json").is_file():
            raise BadInput(f"model '{name}': not {' or '.join(HF_PREFIX + n for n in BASE_CONFIGS)}, nor an absolute "
                           f"path to a directory with a config.json")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except (ValueError, OSError, json.JSONDecodeError) as exc:
            raise BadInput(f"model directory {path}: {exc}") from None
    if config.model_type not in ENCODERS:
        raise BadInput(f"model '{name}': architecture {config.model_type!r} is not one pictl splits "
                       f"(Hugging Face encoder classifiers: {', '.join(ENCODERS)})")
    for key, value in overrides.items():  # (`--model-arg`, and training's dropout: what timm's kwargs are to timm)
        if not hasattr(config, key):
            raise BadInput(f"model '{name}': its configuration has no '{key}'")
        setattr(config, key, value)
    if weights_in(name) and config.num_labels != num_classes:  # a trained head has its own width
        raise BadInput(f"model '{name}': its classifier has {config.num_labels} outputs (config.json); run it with "
                       f"--num-classes {config.num_labels}")
    config.num_labels = num_classes
    return config


def create_text_model(name: str, num_classes: int, tokens: int, **overrides: Any) -> nn.Module:
    """The classifier's structure with no weights behind it (`overrides` set in its configuration);
    `pretrained_cfg` says what one input is."""
    try:
        from transformers import AutoModelForSequenceClassification
    except ImportError:
        raise BadInput(f"model '{name}': transformers is not installed on this host (pip install transformers)") \
            from None
    config = _config(name, num_classes, overrides)
    room = config.max_position_embeddings - (config.pad_token_id + 1 if config.model_type != "bert" else 0)
    if not 1 <= tokens <= room:
        raise BadInput(f"model '{name}': {tokens} tokens per input; it takes 1 to {room}")
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
    model.pretrained_cfg = {"input_size": (tokens,), "vocab_size": config.vocab_size,
                            "pad_token_id": config.pad_token_id or 0}
    return model.eval()


def weights_in(name: str) -> str | None:
    """The safetensors file of a model directory, if it has one (a seeded model otherwise)."""
    folder = hf_model_dir(name)
    path = Path(folder).expanduser() / WEIGHTS if folder else None
    return str(path) if path and path.is_file() else None


@torch.no_grad()
def restore_buffers(model: nn.Module) -> None:
    """Give back what `to_empty` left as garbage: the embeddings' position and token-type id tables, which are
    not weights (not in any checkpoint) but ranges and zeros the model made at construction."""
    for module in model.modules():
        for attr in ("position_ids", "token_type_ids"):
            buf = getattr(module, attr, None)
            if isinstance(buf, torch.Tensor) and attr in module._buffers:
                if attr == "position_ids":
                    buf.copy_(torch.arange(buf.shape[-1]).expand_as(buf))
                else:
                    buf.zero_()


def is_encoder_classifier(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in ENCODERS and hasattr(model, "classifier")


def _layer_pieces(base: str, i: int, chunked: bool) -> list[Piece]:
    p = f"{base}.encoder.layer.{i}"

    def layer_of(m: nn.Module) -> nn.Module:
        return m.get_submodule(p)

    if chunked:  # feed-forward chunking splits the tokens: the layer runs whole
        return [Piece(p, (), (p,), None, lambda m, s: (layer_of(m)(s[0]),))]

    def attention(m: nn.Module, s: State) -> State:
        return (layer_of(m).attention(s[0])[0],)

    def intermediate(m: nn.Module, s: State) -> State:
        return (layer_of(m).intermediate(s[0]), s[0])

    def output(m: nn.Module, s: State) -> State:
        return (layer_of(m).output(s[0], s[1]),)

    return [Piece(p, (f"{p}.attention",), (f"{p}.attention",), None, attention),
            Piece(f"{p}.intermediate", (), (f"{p}.intermediate",), None, intermediate),
            Piece(f"{p}.output", (), (f"{p}.output",), None, output)]


def text_pieces(model: nn.Module) -> list[Piece]:
    """The classifier's forward pass, in order, as pieces."""
    base = model.base_model_prefix
    body = model.get_submodule(base)
    embed_modules = (f"{base}.embeddings",) + ((f"{base}.embeddings_project",)
                                              if hasattr(body, "embeddings_project") else ())

    def embed(m: nn.Module, s: State) -> State:
        inner = m.get_submodule(base)
        x = inner.embeddings(input_ids=s[0])
        return (inner.embeddings_project(x),) if hasattr(inner, "embeddings_project") else (x,)

    pooler = getattr(body, "pooler", None)
    head_modules = ((f"{base}.pooler",) if pooler is not None else ()) + tuple(
        n for n in ("dropout", "classifier") if hasattr(model, n))

    def head(m: nn.Module, s: State) -> State:
        if pooler is not None:  # BERT: the pooler's tanh over [CLS], then dropout and a Linear
            return (m.classifier(m.dropout(m.get_submodule(base).pooler(s[0]))),)
        return (m.classifier(s[0]),)  # RoBERTa, ELECTRA: a head that takes [CLS] itself

    chunked = bool(getattr(model.config, "chunk_size_feed_forward", 0))
    pieces = [Piece(f"{base}.embeddings", (), embed_modules, None, embed)]
    for i in range(len(body.encoder.layer)):
        pieces += _layer_pieces(base, i, chunked)
    pieces.append(Piece("classifier", (), head_modules, None, head))
    return pieces
