"""A user's own model (`package.module:factory`): the controller finds its module in the directory pictl runs in
and pushes it beside `remote/` (a single file, or a package's .py files), refusing pictl's own names and a
module that is not there; the host builds what the factory returns on the meta device and refuses, in one line,
a factory that fails, returns something else, or feeds no floating-point rows. A real two-host run:
tests/functional/test_models.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pictl.cluster.push import local_tree, user_tree
from pictl.errors import ConfigError
from remote.floor.errors import BadInput
from remote.floor.spec import RunSpec, factory_of
from remote.toolkit.stage import layout_for
from remote.toolkit.user_models import create_factory_model

MODULE = '''
import torch
from torch import nn


def good():
    return nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(1, 6)


def broken():
    raise RuntimeError("no weights file here")


def model_only():
    return nn.Linear(6, 2)


def token_ids():
    return nn.Sequential(nn.Embedding(9, 4)), torch.zeros(1, 5, dtype=torch.long)


def materialised():
    assert torch.empty(1).device.type == "meta"  # built where nothing is allocated
    return nn.Sequential(nn.Linear(3, 3)), torch.randn(2, 3)
'''


def test_names_and_the_code_pushed(tmp_path: Path) -> None:
    assert factory_of("labmodels.cnn:small") == ("labmodels.cnn", "small")
    assert factory_of("resnet18") is None and factory_of("hf:bert-base") is None and factory_of("a:b-c") is None
    (tmp_path / "single.py").write_text(MODULE)
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/nets.py"):
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    assert user_tree("single:good", tmp_path) == {"single.py": MODULE.encode()}
    assert sorted(user_tree("pkg.sub.nets:f", tmp_path)) == ["pkg/__init__.py", "pkg/sub/__init__.py",
                                                             "pkg/sub/nets.py"]
    assert user_tree("resnet18", tmp_path) == {}
    with pytest.raises(ConfigError, match=r"model 'absent:f': no absent.py or package absent/ in "):
        user_tree("absent:f", tmp_path)
    with pytest.raises(ConfigError, match="'remote' is pictl's own name"):
        user_tree("remote.toolkit.model:create_meta_model", tmp_path)
    assert "remote/toolkit/user_models.py" in local_tree("resnet18") and "single.py" not in local_tree()


def test_the_host_builds_the_factorys_model_on_meta_and_refuses_the_rest(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "usermods_t.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    layout = layout_for(RunSpec(model="usermods_t:good", stages=2, policy="equal"))
    assert [p.name for p in layout.pieces] == ["0", "1", "2"] and layout.input_size == (6,)
    assert all(p.device.type == "meta" for p in layout.meta_model.parameters())
    assert create_factory_model("usermods_t:materialised").pretrained_cfg["input_size"] == (3,)
    refusals = {
        "usermods_t:broken": "the factory failed on the meta device (RuntimeError: no weights file here)",
        "usermods_t:model_only": "must return (model, example input), a Module and a Tensor",
        "usermods_t:token_ids": "its example input is torch.int64 of shape [1, 5]; pictl feeds floating-point",
        "usermods_t:absent": "usermods_t has no function absent",
        "nosuchmodule_t:f": "cannot import nosuchmodule_t on this host",
    }
    for name, words in refusals.items():
        with pytest.raises(BadInput, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                           .replace("]", r"\]")):
            create_factory_model(name)
    sys.modules.pop("usermods_t", None)
    assert torch.empty(1).device.type == "cpu"  # the meta device did not outlive the factory
