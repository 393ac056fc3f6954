"""Any model through the same pipeline: CNNs of several timm families, a Hugging Face classifier and a user's own
model run as 2-stage pipelines on a local cluster (real torchrun), each one's outputs bit-identical to its serial
run's; `balanced` profiles a CNN's pieces and cuts it; `--list-splits` lists a model's cuts as its first host
plans them; a cut that is not one, or a model pictl does not split, is refused before anything starts (exit 2,
one line naming the model, nothing left)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import write_cluster

import pictl

pytestmark = pytest.mark.slow

QUICK = {"images": 4, "chunk": 2, "warmup": 0, "repeats": 1, "threads": 1}


@pytest.fixture(scope="module")
def cluster_path(tmp_path_factory) -> Path:
    return write_cluster(tmp_path_factory.mktemp("models") / "cluster", 2)


# (ResNet-18: test_balanced_cuts_a_cnn_from_its_profiled_pieces, the same pipeline cut where `balanced` puts it.)
@pytest.mark.parametrize(("model", "first_cut"), [("mobilenetv2_100", "blocks."), ("efficientnet_b0", "blocks."),
                                                  ("convnext_atto", "stages.")])
def test_a_cnn_pipeline_gives_its_serial_runs_logits_bit_for_bit(cluster_path: Path, tmp_path: Path, model: str,
                                                                  first_cut: str, monkeypatch) -> None:
    monkeypatch.setenv("PICTL_CACHE_DIR", str(tmp_path / "cache"))
    summary = pictl.run_experiment(pictl.load_cluster(cluster_path), model=model, stages=2, policy="equal",
                                   runs_dir=tmp_path / "runs", **QUICK)
    assert summary.status == "ok" and summary.model == model and summary.outputs_match is True
    assert summary.max_abs_diff == 0.0 and summary.speedup and summary.speedup > 0
    (cut,) = summary.split_points
    assert cut.startswith(first_cut), cut
    assert [len(st.modules) > 0 for st in summary.per_stage] == [True, True]
    assert summary.per_stage[0].modules[0] in ("conv1", "conv_stem", "stem")


def test_balanced_cuts_a_cnn_from_its_profiled_pieces_and_a_wrong_cut_names_the_valid_ones(
        cluster_path: Path, tmp_path: Path, pictl_env) -> None:
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    common = ["run", "--hosts", str(cluster_path), "--model", "resnet18", "--images", "4", "--chunk", "2",
              "--warmup", "1", "--repeats", "1", "--threads", "1", "--headless"]
    proc = run_pictl([*common, "--stages", "2", "--policy", "balanced", "--no-refine", "--json"], env)
    assert proc.returncode in (0, 10), proc.stderr[-3000:]  # (10: SUSPECT on a busy machine; the split is the point)
    s = json.loads(proc.stdout)
    # A ResNet's pipeline gives its serial run's logits bit for bit (as the CNNs above), cut between its layers.
    assert s["status"] == "ok" and s["model"] == "resnet18" and s["speedup"] > 0
    assert s["outputs_match"] is True and s["max_abs_diff"] == 0.0 and s["split_points"][0].startswith("layer")
    assert len(s["split_points"]) == 1 and [len(st["modules"]) > 0 for st in s["per_stage"]] == [True, True]
    assert s["per_stage"][0]["modules"][0] == "conv1"
    assert s["prediction"]["first_split"] == s["split_points"] and len(s["prediction"]["stage_ms"]) == 2

    listed = run_pictl(["run", "--hosts", str(cluster_path), "--model", "resnet18", "--list-splits", "--json"], env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    cuts = json.loads(listed.stdout)["cuts"]
    assert cuts == [f"layer{i}.{j}" for i in range(1, 5) for j in (0, 1)] + ["global_pool"]

    runs_before = sorted((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
    bad = run_pictl([*common, "--stages", "2", "--split", "layer1.0.conv1", "--runs-dir", str(tmp_path / "runs")],
                    env)
    assert bad.returncode == 2
    (line,) = [x for x in bad.stderr.splitlines() if x.startswith("pictl: error:")]
    assert "split point 'layer1.0.conv1' is a module of model 'resnet18' but not a place a stage can begin; its " \
           f"cuts: {', '.join(cuts)}" in line
    assert sorted((tmp_path / "runs").glob("*")) == runs_before  # no run directory left behind
    other = run_pictl(["run", "--hosts", str(cluster_path), "--model", "densenet121", "--list-splits"], env)
    assert other.returncode == 2 and "model 'densenet121' is a DenseNet; pictl splits timm ViTs" in other.stderr


def test_a_hugging_face_classifier_pipeline_gives_its_serial_runs_logits_bit_for_bit(
        cluster_path: Path, tmp_path: Path, monkeypatch) -> None:
    """A small BERT as `save_pretrained` writes it (config.json and model.safetensors), read by both hosts."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=64, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    import torch
    from safetensors.torch import save_file  # a tokenized evaluation set, labelled: the run reports accuracy

    ids = torch.randint(1, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids, "labels": torch.tensor([0, 1, 2, 0])}, tmp_path / "eval.safetensors")
    monkeypatch.setenv("PICTL_CACHE_DIR", str(tmp_path / "cache"))
    summary = pictl.run_experiment(pictl.load_cluster(cluster_path), model=f"hf:{tmp_path / 'bert'}", num_classes=3,
                                   tokens=24, stages=2, split=["bert.encoder.layer.2.intermediate"],
                                   data="tokens", data_path=str(tmp_path / "eval.safetensors"),
                                   runs_dir=tmp_path / "runs", **QUICK)
    assert summary.status == "ok" and summary.outputs_match is True and summary.max_abs_diff == 0.0
    assert summary.accuracy is not None and summary.accuracy == summary.serial_accuracy
    assert summary.split_points == ["bert.encoder.layer.2.intermediate"]
    assert summary.per_stage[0].modules[0] == "bert.embeddings" and summary.per_stage[1].modules[-1] == "classifier"


FACTORY = '''
import torch
from timm.models.vgg import VGG


def narrow_vgg11():
    """VGG-11's layout at an eighth of its width, with a 64-wide head: a VGG, run in seconds."""
    cfg = [8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"]
    return VGG(cfg, num_classes=5, mlp_ratio=1 / 64), torch.randn(1, 3, 224, 224)
'''


def test_a_users_own_model_is_pushed_and_runs_bit_for_bit(cluster_path: Path, tmp_path: Path, monkeypatch) -> None:
    """`package.module:factory` from the directory pictl runs in: its module goes to the hosts with pictl's code.
    Here it builds a narrowed VGG, a family pictl splits: it keeps VGG's cuts (before each convolution, the head).
    (An nn.Sequential's cuts between its children: tests/unit/test_user_models.py.)"""
    (tmp_path / "labmodels").mkdir()
    (tmp_path / "labmodels" / "__init__.py").write_text("")
    (tmp_path / "labmodels" / "vgg.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PICTL_CACHE_DIR", str(tmp_path / "cache"))
    summary = pictl.run_experiment(pictl.load_cluster(cluster_path), model="labmodels.vgg:narrow_vgg11", stages=2,
                                   split=["features.6"], num_classes=5, runs_dir=tmp_path / "runs", **QUICK)
    assert summary.status == "ok" and summary.outputs_match is True and summary.max_abs_diff == 0.0
    first, second = (st.modules for st in summary.per_stage)
    assert first[0] == "features.0" and second[0] == "features.6", (first, second)
    assert second[-2:] == ["pre_logits", "pre_logits.fc2"], second  # (the head: its two fully-connected layers)
