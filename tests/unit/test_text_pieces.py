"""Hugging Face encoder classifiers as pieces (`remote.toolkit.text_models`): for a small BERT, RoBERTa and ELECTRA
written by `save_pretrained`, the pieces cover every parameter once and compute transformers' own logits bit for
bit; every two-stage split, built as the ranks build it (only its own modules materialised, weights read from
the directory), computes the whole model's logits bit for bit; synthetic token ids never hold the padding id; and
what pictl cannot run is refused with one line naming the model. In-process; a real two-host run:
tests/functional/test_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from remote.data.images import load_images
from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.artifact import meta_model_for
from remote.toolkit.kept_pair import whole_forward
from remote.toolkit.model import materialize
from remote.toolkit.outputs import open_checkpoint
from remote.toolkit.partition import piece_params
from remote.toolkit.stage import build_stage, layout_for, stage_io_shapes

transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 120, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 48, "num_labels": 3}
FAMILIES = {
    "bert": ("BertConfig", "BertForSequenceClassification", {}),
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification", {"pad_token_id": 1,
                                                                     "max_position_embeddings": 40}),
    "electra": ("ElectraConfig", "ElectraForSequenceClassification", {"embedding_size": 24}),
}


def _saved(root: Path, family: str) -> tuple[Path, torch.nn.Module]:
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(7)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**SMALL, **extra)).eval()
    model.save_pretrained(root / family)
    return root / family, model


@pytest.mark.parametrize("family", FAMILIES)
def test_pieces_compute_transformers_logits_and_every_split_the_whole_models(tmp_path: Path, family: str) -> None:
    folder, reference = _saved(tmp_path, family)
    spec = RunSpec(model=f"hf:{folder}", num_classes=3, tokens=12, images=3, chunk=3)
    whole = materialize(meta_model_for(spec), seed=0, checkpoint=open_checkpoint(spec))
    layout = layout_for(spec)
    assert sum(piece_params(layout.pieces, layout.meta_model)) == sum(p.numel() for p in reference.parameters())
    ids = load_images(spec.data, 3, whole.pretrained_cfg, spec.seed)
    assert ids.dtype == torch.long and ids.shape == (3, 12)
    with torch.no_grad():
        expected = reference(ids).logits
        assert torch.equal(whole_forward(whole)(ids), expected)
        for cut in [p.name for p in layout.pieces[1:]]:
            split = layout_for(RunSpec(model=spec.model, num_classes=3, tokens=12, stages=2, split_points=[cut]))
            first, second = (build_stage(spec, split, s, open_checkpoint(spec)) for s in split.stages)
            sent = first(ids)  # (inside a layer, two tensors cross: the activations and the residual)
            assert torch.equal(second(*sent) if isinstance(sent, tuple) else second(sent), expected), cut
            assert stage_io_shapes(split, 3)[0][0] == [torch.Size([3, 12])]


def test_a_model_built_from_its_base_configuration_is_seeded_and_never_feeds_the_padding_id() -> None:
    spec = RunSpec(model="hf:roberta-base", num_classes=4, tokens=64)
    layout = layout_for(spec)
    assert [p.name for p in layout.pieces][:3] == ["roberta.embeddings", "roberta.encoder.layer.0",
                                                   "roberta.encoder.layer.0.intermediate"]
    assert len(layout.pieces) == 2 + 3 * 12 and open_checkpoint(spec) is None
    ids = load_images(spec.data, 40, layout.meta_model.pretrained_cfg, seed=5)
    assert not (ids == 1).any() and int(ids.max()) < 50265
    assert torch.equal(ids, load_images(spec.data, 40, layout.meta_model.pretrained_cfg, seed=5))


def test_what_pictl_cannot_run_is_refused_with_one_line(tmp_path: Path) -> None:
    folder, _ = _saved(tmp_path, "bert")
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(gpt2)
    cases = [
        (RunSpec(model="hf:nothing-like-this"), "not hf:bert-base or hf:roberta-base, nor an absolute path"),
        (RunSpec(model=f"hf:{tmp_path}/absent"), "nor an absolute path to a directory with a config.json"),
        (RunSpec(model=f"hf:{gpt2}"), "architecture 'gpt2' is not one pictl splits"),
        (RunSpec(model=f"hf:{folder}", num_classes=1000), "its classifier has 3 outputs (config.json); run it "
                                                          "with --num-classes 3"),
        (RunSpec(model=f"hf:{folder}", num_classes=3, tokens=513), "513 tokens per input; it takes 1 to 512"),
    ]
    for spec, words in cases:
        with pytest.raises(BadInput, match=words.replace("(", r"\(").replace(")", r"\)")):
            layout_for(spec)
    with pytest.raises(BadInput, match=r"holds images; a text model takes token ids \(synthetic or tokens\)"):
        from remote.floor.spec import DataSpec
        load_images(DataSpec(kind="cifar10", path=str(tmp_path)), 2, {"vocab_size": 9, "input_size": (4,),
                                                                       "pad_token_id": 0}, 0)


def test_a_trained_text_model_written_as_an_artifact_is_read_back_as_the_same_model(tmp_path: Path) -> None:
    """What `pictl train` leaves for `pictl run --model FILE`: the base named, its token count kept."""
    from remote.floor.artifact_meta import ArtifactMeta
    from remote.toolkit.artifact import meta_model_from_artifact, save_artifact

    folder, reference = _saved(tmp_path, "roberta")
    path = save_artifact(reference, ArtifactMeta(base_model=f"hf:{folder}", num_classes=3, heads={},
                                                 model_kwargs={"tokens": 12}), tmp_path / "trained.safetensors")
    spec = RunSpec(model=f"hf:{folder}", num_classes=3, checkpoint=str(path))
    meta = meta_model_from_artifact(path, model=spec.model, num_classes=3)
    assert meta is not None and meta.pretrained_cfg["input_size"] == (12,)
    whole = materialize(meta, seed=0, checkpoint=open_checkpoint(spec))
    ids = load_images(spec.data, 2, whole.pretrained_cfg, 0)
    with torch.no_grad():
        assert torch.equal(whole_forward(whole)(ids), reference(ids).logits)


def test_a_tokenized_file_feeds_its_ids_and_labels_and_what_does_not_fit_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from remote.data.images import load_labels
    from remote.floor.spec import DataSpec

    cfg = {"input_size": (6,), "vocab_size": 50, "pad_token_id": 0}
    ids = torch.randint(1, 50, (5, 6), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids.int(), "labels": torch.tensor([0, 1, 2, 1, 0])}, tmp_path / "eval.safetensors")
    data = DataSpec(kind="tokens", path=str(tmp_path / "eval.safetensors"))
    assert torch.equal(load_images(data, 4, cfg, seed=0), ids[:4]) and load_images(data, 4, cfg, 0).dtype == torch.long
    assert load_labels(data, 4).tolist() == [0, 1, 2, 1]
    padded = ids.clone()
    padded[3, 5] = 0
    files = {"padded": {"input_ids": padded}, "floats": {"input_ids": ids.float()}, "other": {"ids": ids}}
    for name, tensors in files.items():
        save_file(tensors, tmp_path / f"{name}.safetensors")
    refusals = [
        ("padded", cfg, 5, "input 3 holds the padding id 0; pictl runs unpadded inputs"),
        ("floats", cfg, 5, "'input_ids' must be integers, inputs x tokens"),
        ("other", cfg, 5, "no 'input_ids' tensor (it holds ids)"),
        ("eval", {**cfg, "input_size": (8,)}, 5, "6 tokens per input; run it with --tokens 6"),
        ("eval", {**cfg, "vocab_size": 20}, 5, "token ids outside the model's vocabulary of 20"),
        ("eval", cfg, 9, "has 5 images; 9 were asked for"),
        ("absent", cfg, 1, "does not exist (--data tokens takes a .safetensors file)"),
    ]
    for name, model_cfg, count, words in refusals:
        with pytest.raises(BadInput, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_images(DataSpec(kind="tokens", path=str(tmp_path / f"{name}.safetensors")), count, model_cfg, 0)
    with pytest.raises(BadInput, match="holds token ids; this model takes images"):
        load_images(data, 2, {"input_size": (3, 8, 8)}, 0)
