"""A profile's `[rules]`: parsed with the key named when wrong, and every front end's options checked against them
before anything starts (`resolve_options`), one line naming the profile and the rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pictl.errors import ConfigError
from pictl.planning.options import RunOptions
from pictl.planning.presets import preset_rules, resolve_options
from pictl.planning.rules import GradingRules, below_floor, broken_rule, parse_rules


@pytest.fixture
def profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PICTL_PROFILES_DIR", str(tmp_path))
    return tmp_path


def test_the_shipped_graded_preset_keeps_its_own_rules_and_refuses_a_change() -> None:
    options = resolve_options("lab6-graded", {})
    assert (options.stages, options.images, options.chunk, options.warmup, options.repeats) == (4, 500, 1, 1, 5)
    rules = preset_rules("lab6-graded")
    assert rules is not None and rules.exact and rules.chunk == 1
    with pytest.raises(ConfigError) as chunk:
        resolve_options("lab6-graded", {"chunk": 2})
    assert str(chunk.value).startswith("profile 'lab6-graded' (")
    assert str(chunk.value).endswith("lab6-graded.toml): breaks its rule chunk = 1 (this run: 2)")
    with pytest.raises(ConfigError, match=r"breaks its rule exact = true \(this run's wire fp16 is lossy\)"):
        resolve_options("lab6-graded", {"wire": "fp16"})
    assert preset_rules("lab6") is None and resolve_options("lab6", {"chunk": 2}).chunk == 2  # no rules: free


def test_a_floor_on_accuracy_needs_labelled_data_and_is_met_or_missed(profiles: Path) -> None:
    (profiles / "part3.toml").write_text("stages = 2\n[rules]\nmin_accuracy = 0.88\n")
    with pytest.raises(ConfigError, match="min_accuracy = 0.88 .*synthetic: accuracy needs a labelled data set"):
        resolve_options("part3", {})
    rules = GradingRules(min_accuracy=0.88)
    assert below_floor(rules, 0.9) is None and below_floor(rules, None) is not None
    assert below_floor(rules, 0.87) == "min_accuracy = 0.88 (the run measured 0.8700)"
    assert below_floor(rules, 0.9, floor=0.95) == "min_accuracy = 0.95 (the run measured 0.9000)"
    assert below_floor(GradingRules(), 0.1) is None


def test_a_bad_rules_table_is_named_by_file_and_key(profiles: Path) -> None:
    (profiles / "bad.toml").write_text('[rules]\nchunk = "1"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: rules.chunk: "):
        resolve_options("bad", {})
    (profiles / "typo.toml").write_text("[rules]\nchunks = 1\n")
    with pytest.raises(ConfigError, match=r"typo.toml: rules.chunks"):
        resolve_options("typo", {})
    assert parse_rules(None, "x") is None


def test_exactness_also_refuses_other_numerics_and_a_tolerance() -> None:
    rules = GradingRules(exact=True, stages=2)
    assert broken_rule(rules, RunOptions(stages=2)) is None
    assert broken_rule(rules, RunOptions(stages=3)) == "stages = 2 (this run: 3)"
    assert "numerics are int8-dynamic" in (broken_rule(rules, RunOptions(stages=2, numerics="int8-dynamic")) or "")
    assert "--atol 0.1" in (broken_rule(rules, RunOptions(stages=2, atol=0.1)) or "")
    assert os.environ.get("PICTL_PROFILES_DIR")  # (the suite never reads the user's own presets)
