"""CNNs as pieces (`remote.toolkit.cnn_pieces`): for a small member of every family pictl splits, the pieces
cover every parameter once; a two-stage split's stages (cut after the stem, mid-way and at the head), built as
the ranks build them (only their own modules materialised), compute the whole model's logits bit for bit; and a
cut that is not one is refused with one line naming the model and its cuts. In-process; a real two-host run:
tests/functional/test_models.py."""

from __future__ import annotations

import pytest
import torch

from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec
from remote.toolkit.cnn_pieces import pieces_for
from remote.toolkit.model import create_meta_model, materialize
from remote.toolkit.partition import piece_params
from remote.toolkit.stage import build_stage, layout_for

NARROW_VGG = "cnnpieces_vgg:narrow_vgg11"
"""VGG-11's layout at an eighth of its width and a 64-wide head, built by a factory (`package.module:factory`):
VGG's pieces at a twentieth of the full model's time (its 7x7 head still wants 224 px)."""
FAMILIES = ["resnet18", "mobilenetv2_100", "efficientnet_b0", "mobilenetv3_small_050", "convnext_atto",
            "regnetx_002", NARROW_VGG]


@pytest.fixture(autouse=True)
def _narrow_vgg(tmp_path_factory, monkeypatch) -> None:
    folder = tmp_path_factory.getbasetemp() / "cnnpieces"
    folder.mkdir(exist_ok=True)
    (folder / "cnnpieces_vgg.py").write_text(
        "import torch\nfrom timm.models.vgg import VGG\n\n\ndef narrow_vgg11():\n"
        "    cfg = [8, 'M', 16, 'M', 32, 32, 'M', 64, 64, 'M', 64, 64, 'M']\n"
        "    return VGG(cfg, num_classes=10, mlp_ratio=1 / 64), torch.randn(1, 3, 224, 224)\n")
    monkeypatch.syspath_prepend(str(folder))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_two_stage_split_computes_the_whole_models_logits(name: str) -> None:
    meta = create_meta_model(name, 10)
    pieces = pieces_for(meta, name)
    assert sum(piece_params(pieces, meta)) == sum(p.numel() for p in meta.parameters())
    whole = materialize(create_meta_model(name, 10), seed=3, checkpoint=None)
    size = 224 if name == NARROW_VGG else 64  # (VGG's head is a 7x7 convolution: its input is at least 7x7)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = whole(x)
        cuts = [p.name for p in pieces[1:]]
        for cut in dict.fromkeys([cuts[0], cuts[len(cuts) // 2], cuts[-1]]):  # after the stem, mid-way, at the head
            spec = RunSpec(model=name, num_classes=10, stages=2, policy="explicit", split_points=[cut], seed=3)
            layout = layout_for(spec)
            first, second = (build_stage(spec, layout, stage, None) for stage in layout.stages)
            assert torch.equal(second(first(x)), expected), cut


def test_a_cut_that_is_not_one_is_refused_naming_the_model_and_its_cuts() -> None:
    spec = RunSpec(model="resnet18", stages=2, policy="explicit", split_points=["layer1.0.conv1"])
    with pytest.raises(BadInput) as found:
        layout_for(spec)
    message = str(found.value)
    assert message.startswith("split point 'layer1.0.conv1' is a module of model 'resnet18' but not a place a stage "
                              "can begin; its cuts: layer1.0, layer1.1, layer2.0,")
    assert message.endswith("layer4.1, global_pool") and "\n" not in message


def test_a_model_pictl_does_not_split_is_refused_with_what_it_splits() -> None:
    with pytest.raises(BadInput) as found:
        pieces_for(create_meta_model("densenet121", 10), "densenet121")
    assert str(found.value).startswith("model 'densenet121' is a DenseNet; pictl splits timm ViTs")
    assert "ResNets" in str(found.value) and "ConvNeXts" in str(found.value)
