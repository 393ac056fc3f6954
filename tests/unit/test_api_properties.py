"""Property tests of the Python API (`import pictl`): whatever bad argument a caller passes to `run_experiment`,
`sweep`, `tune`, `train`, `prune`, `load_cluster` or `runs` (a value past its bounds or of the wrong kind, an
unknown keyword, a string for a cluster, a dict for options, a number for a path, a handler that is not a
function, "no" for a yes/no), a `pictl.errors.ConfigError` comes out, one line in pictl's words (never pydantic's),
before anything starts. The cluster is a tripwire: its hosts are SSH logins on a closed port, so a call that got
as far as a host would raise TransportError instead, after no time at all; and no run, sweep, tune or job
directory may appear. Nothing here launches torchrun or imports torch."""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import pictl
from pictl import errors as E

SETTINGS = settings(max_examples=int(os.environ.get("PICTL_API_EXAMPLES", "120")), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
WORK = Path(tempfile.mkdtemp(prefix="pictl-api-properties-"))
PYDANTIC_WORDS = re.compile(r"Input should|String should|List should|validation errors? for|Value error|Extra inputs|"
                            r"Field required|errors\.pydantic|type=|input_value")
"""pydantic's own phrasing, which a caller never sees (`pictl.validation` says every problem in pictl's words)."""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tripwire() -> pictl.Cluster:
    """Two SSH hosts on a port nothing listens on: contacting one fails at once, with TransportError."""
    path = WORK / "tripwire.toml"
    path.write_text(f'[cluster]\nname = "tripwire"\n[defaults]\ntransport = "ssh"\naddress = "127.0.0.1"\n'
                    f'port = {_closed_port()}\nuser = "nobody"\nwarm = false\n'
                    f'[[host]]\nname = "h0"\nworkdir = "{WORK}/h0"\n[[host]]\nname = "h1"\nworkdir = "{WORK}/h1"\n')
    return pictl.load_cluster(path)


TRIPWIRE = _tripwire()
WRITES = {"runs_dir": WORK / "runs", "out": WORK / "out", "root": WORK / "root"}
"""Where each entry point would write: none of them may exist after a refused call."""


def _refused(call: Callable[[], Any]) -> str:
    """`call()` raises ConfigError (anything else, pictl's own or not, fails the test), in one line of pictl's
    words, and left nothing behind; its message."""
    with pytest.raises(E.PictlError) as info:
        call()
    assert isinstance(info.value, E.ConfigError), f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert message and "\n" not in message and not PYDANTIC_WORDS.search(message), message
    left = [p for p in (*WRITES.values(), WORK / "h0", WORK / "h1") if os.path.lexists(p)]
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"a refused call left {left}"
    return message


# -- bad values, derived from each model's fields: past a bound, or of another kind ----------------------------

def _unwrapped(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        members = [a for a in get_args(annotation) if a is not NoneType]
        return members[0] if len(members) == 1 else annotation
    return annotation


def _bounds(info: Any) -> tuple[float | None, float | None]:
    low = high = None
    for c in info.metadata:
        if isinstance(c, at.Ge | at.Gt):
            low = c.ge if isinstance(c, at.Ge) else c.gt
        if isinstance(c, at.Le | at.Lt):
            high = c.le if isinstance(c, at.Le) else c.lt
    return low, high


def _past(low: float | None, high: float | None, whole: bool) -> list[st.SearchStrategy[Any]]:
    """Numbers past a field's bounds (a bound that excludes itself: the bound too)."""
    found: list[st.SearchStrategy[Any]] = []
    if low is not None:
        found.append(st.integers(max_value=math.ceil(low) - 1) if whole
                     else st.floats(max_value=low, exclude_max=True, allow_nan=False))
    if high is not None:
        found.append(st.integers(min_value=math.floor(high) + 1) if whole
                     else st.floats(min_value=high, exclude_min=True))
    return found


def bad_value(model: type[BaseModel], name: str) -> st.SearchStrategy[Any]:
    """A value `model` refuses for field `name` (strict or not: nothing here is one lax mode would take)."""
    info = model.model_fields[name]
    kind = _unwrapped(info.annotation)
    low, high = _bounds(info)
    limits = {type(c).__name__: c for c in info.metadata}
    if kind is bool:
        return st.sampled_from(["maybe", 2, [], 1.5])
    if kind is int:
        return st.one_of(*_past(low, high, whole=True), st.sampled_from(["two", 2.5, [], {}, "", float("nan")]))
    if kind is float:
        odd = ["fast", [], {}, float("nan")] + ([float("inf")] if high is not None or low is not None else [])
        return st.one_of(*_past(low, high, whole=False), st.sampled_from(odd))
    if kind is str:
        odd: list[Any] = [5, [], {}, 2.5]
        if "MinLen" in limits:
            odd.append("")
        if "MaxLen" in limits:
            odd.append("x" * (limits["MaxLen"].max_length + 1))
        return st.sampled_from(odd)
    if get_origin(kind) is Literal:
        return st.one_of(st.text(max_size=12).filter(lambda t: t not in get_args(kind)), st.sampled_from([5, []]))
    if get_origin(kind) in (list, dict):
        return st.sampled_from(["text", 5, 2.5] + ([[1]] if get_origin(kind) is list else [[]]))
    raise AssertionError(f"{model.__name__}.{name}: no bad values for {kind!r}")


def bad_field(model: type[BaseModel], skip: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """One keyword `model` refuses: a field's bad value, or a name that is no field (nor a parameter)."""
    names = [n for n in model.model_fields if n not in skip]
    field = st.sampled_from(names).flatmap(lambda n: bad_value(model, n).map(lambda v: {n: v}))
    unknown = st.from_regex(r"[a-z][a-z_]{0,14}", fullmatch=True).filter(
        lambda n: n not in model.model_fields and n not in API_WORDS).map(lambda n: {n: 1})
    return st.one_of(field, unknown)


API_WORDS = {"cluster", "options", "profile", "runs_dir", "on_event", "fresh_baseline", "wait", "stages", "chunks",
             "policies", "wires", "out", "allow_loss", "min_agreement", "measure", "budget_s", "root", "on_host"}
"""Every entry point's own keywords: an unknown field is none of these either."""
ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3000), st.floats(), st.text(max_size=8),
                st.lists(st.integers(0, 9), max_size=3))


def noise(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """Other fields with any values (good or bad: whichever the model meets first, it must refuse as bad)."""
    return st.dictionaries(st.sampled_from(list(model.model_fields)), ANY, max_size=3)


NOT_A_PATH = st.sampled_from([5, 2.5, b"/tmp/x", [], "", "  ", "a\x00b", "/proc/pictl-no/such/dir"])
NOT_A_FLAG = st.sampled_from(["no", "yes", "False", 0, 1, None, []])
NOT_A_HANDLER = st.sampled_from([5, "print", [], object()])
NOT_A_CLUSTER = st.sampled_from(["hosts.toml", 5, {"hosts": []}, [], Path("hosts.toml")])
NOT_OPTIONS = st.sampled_from([{"stages": 2}, "stages=2", 5, []])
NOT_A_PROFILE = st.sampled_from([5, "", "../x", "/etc/passwd", "no-such-profile-here"])


def _one(**choices: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """One of the keywords, with one of its bad values."""
    return st.one_of(*(s.map(lambda v, k=k: {k: v}) for k, s in choices.items()))


def _call(base: dict[str, Any], extra: dict[str, Any], bad: dict[str, Any]) -> dict[str, Any]:
    return {**base, **extra, **bad}  # the bad keyword last: nothing else may make it good


RUN_BASE = {"cluster": TRIPWIRE, "runs_dir": WRITES["runs_dir"]}


@SETTINGS
@given(extra=noise(pictl.RunOptions), bad=st.one_of(
    bad_field(pictl.RunOptions),
    _one(cluster=NOT_A_CLUSTER, options=NOT_OPTIONS, runs_dir=NOT_A_PATH, on_event=NOT_A_HANDLER,
         fresh_baseline=NOT_A_FLAG, wait=NOT_A_FLAG, profile=NOT_A_PROFILE)))
def test_run_experiment_refuses_any_bad_argument_before_a_host_is_touched(extra: dict[str, Any],
                                                                           bad: dict[str, Any]) -> None:
    _refused(lambda: pictl.run_experiment(**_call(RUN_BASE, extra, bad)))


@SETTINGS
@given(bad=bad_field(pictl.RunOptions), extra=noise(pictl.RunOptions))
def test_an_options_object_is_checked_again_whole(bad: dict[str, Any], extra: dict[str, Any]) -> None:
    """`model_copy(update=...)` once let `stages=0` past every check (an IndexError deep inside); an object
    edited after it was made is caught the same way."""
    options = pictl.RunOptions()
    _refused(lambda: pictl.run_experiment(TRIPWIRE, options, runs_dir=WRITES["runs_dir"], **{**extra, **bad}))
    name, value = next(iter(bad.items()))
    if name in pictl.RunOptions.model_fields:
        edited = pictl.RunOptions()
        setattr(edited, name, value)  # (no check on assignment: the API checks it)
        _refused(lambda: pictl.run_experiment(TRIPWIRE, edited, runs_dir=WRITES["runs_dir"]))
        # a keyword given as None is not given: it leaves the object's value (bad here) as it is, never erases it
        _refused(lambda: pictl.run_experiment(TRIPWIRE, edited, runs_dir=WRITES["runs_dir"], **{name: None}))


SWEEP_BASE = {"cluster": TRIPWIRE, "out": WRITES["out"], "stages": [1, 2], "chunks": [1], "policies": ["equal"]}


@SETTINGS
@given(extra=noise(pictl.RunOptions), bad=st.one_of(
    bad_field(pictl.RunOptions),
    _one(stages=st.sampled_from([[], [0], [-1], ["2"], "1,2", 5, [2.5], [10**9], [True], [1, None]]),
         chunks=st.sampled_from([[], [0], [100_000], "2", [None]]),
         policies=st.sampled_from([[], ["fast"], "equal", [5], ["serial"], ["equal"] * 3]),
         wires=st.sampled_from([[], ["zz"], "fp32", [5], ["lowrank:0"]]),
         cluster=NOT_A_CLUSTER, options=NOT_OPTIONS, out=NOT_A_PATH, on_event=NOT_A_HANDLER, wait=NOT_A_FLAG,
         profile=NOT_A_PROFILE)))
def test_sweep_refuses_any_bad_argument_and_never_sweeps_nothing(extra: dict[str, Any], bad: dict[str, Any]) -> None:
    _refused(lambda: pictl.sweep(**_call(SWEEP_BASE, extra, bad)))


TUNE_BASE = {"cluster": TRIPWIRE, "out": WRITES["out"]}


@SETTINGS
@given(extra=noise(pictl.RunOptions), bad=st.one_of(
    bad_field(pictl.RunOptions),
    _one(min_agreement=st.sampled_from(["high", 2, -0.1, float("nan"), None, [0.9]]),
         measure=st.sampled_from([0, -1, 65, 2.5, "3", True]),
         budget_s=st.sampled_from([0, -5, 0.5, float("nan"), float("inf"), "60"]),
         allow_loss=NOT_A_FLAG, wait=NOT_A_FLAG, cluster=NOT_A_CLUSTER, options=NOT_OPTIONS, out=NOT_A_PATH,
         on_event=NOT_A_HANDLER, profile=NOT_A_PROFILE)))
def test_tune_refuses_any_bad_argument(extra: dict[str, Any], bad: dict[str, Any]) -> None:
    _refused(lambda: pictl.tune(**_call(TUNE_BASE, extra, bad)))


TRAIN_BASE = {"cluster": TRIPWIRE, "root": WRITES["root"], "mode": "pipeline", "stages": 2, "steps": 1}


@SETTINGS
@given(extra=noise(pictl.TrainOptions), bad=st.one_of(
    bad_field(pictl.TrainOptions, skip=("break_rank",)),
    _one(cluster=NOT_A_CLUSTER, options=st.one_of(NOT_OPTIONS, st.just(pictl.RunOptions())), root=NOT_A_PATH,
         on_event=NOT_A_HANDLER, wait=NOT_A_FLAG)))
def test_train_refuses_any_bad_argument(extra: dict[str, Any], bad: dict[str, Any]) -> None:
    _refused(lambda: pictl.train(**_call(TRAIN_BASE, extra, bad)))


PRUNE_BASE = {"root": WRITES["root"], "data": "imagefolder", "data_path": str(WORK)}


@SETTINGS
@given(extra=noise(pictl.PruneOptions), bad=st.one_of(
    bad_field(pictl.PruneOptions),
    _one(options=st.one_of(NOT_OPTIONS, st.just(pictl.RunOptions())), root=NOT_A_PATH, on_event=NOT_A_HANDLER,
         wait=NOT_A_FLAG, on_host=st.sampled_from([5, "", "no-such-host", ["h0"]]))))
def test_prune_refuses_any_bad_argument(extra: dict[str, Any], bad: dict[str, Any]) -> None:
    """(On the controller a prune job would import torch and start at once: it must not get that far.)"""
    call = _call(PRUNE_BASE, extra, bad)
    if "on_host" in bad:
        call["cluster"] = TRIPWIRE
    _refused(lambda: pictl.prune(**call))


@SETTINGS
@given(bad=_one(hosts=st.one_of(NOT_A_PATH, st.just(str(WORK / "no-such.toml"))), cold=NOT_A_FLAG))
def test_load_cluster_refuses_any_bad_argument(bad: dict[str, Any]) -> None:
    _refused(lambda: pictl.load_cluster(**{"hosts": TRIPWIRE.source, **bad}))


@SETTINGS
@given(runs_dir=st.sampled_from([5, 2.5, b"/tmp", [], "", "a\x00b"]))
def test_runs_refuses_a_path_that_is_none(runs_dir: Any) -> None:
    _refused(lambda: pictl.runs(runs_dir))


# -- what the properties rest on, and the CLI's words ----------------------------------------------------------

def test_the_tripwire_would_catch_a_call_that_reached_a_host() -> None:
    """A good call gets past every check and fails at the first host, with another error: the properties above
    would see it."""
    with pytest.raises(E.TransportError):
        pictl.run_experiment(TRIPWIRE, stages=2, images=2, runs_dir=WRITES["runs_dir"])
    assert not WRITES["runs_dir"].exists()


@pytest.mark.parametrize("call, message", [
    (lambda: pictl.run_experiment(TRIPWIRE, images=10**9), "images: must be between 1 and 2000 (got 1000000000)"),
    (lambda: pictl.run_experiment(TRIPWIRE, pictl.RunOptions(), stages=0), "stages: must be between 1 and 128 (got 0)"),
    (lambda: pictl.run_experiment(TRIPWIRE, atol=float("nan")), "atol: must be a finite number (got nan)"),
    (lambda: pictl.run_experiment(TRIPWIRE, imgs=5), "imgs: unknown field (did you mean images?)"),
    (lambda: pictl.run_experiment("hosts.toml"), "cluster: must be a pictl.Cluster, from pictl.load_cluster() "
                                                 "(got 'hosts.toml')"),
    (lambda: pictl.run_experiment(TRIPWIRE, {"stages": 2}), "options: must be a pictl.RunOptions"),
    (lambda: pictl.run_experiment(TRIPWIRE, runs_dir=5), "runs_dir: must be a path (a str or a pathlib.Path) (got 5)"),
    (lambda: pictl.run_experiment(TRIPWIRE, on_event=5), "on_event: must be a function that takes an event"),
    (lambda: pictl.sweep(TRIPWIRE, stages=[]), "stages: must have at least 1 item(s) (got 0)"),
    (lambda: pictl.sweep(TRIPWIRE, policies=["fast"]), "policies[0]: must be 'equal' or 'balanced' (got 'fast')"),
    (lambda: pictl.tune(TRIPWIRE, min_agreement="high"), "min_agreement: must be a number (got 'high')"),
    (lambda: pictl.tune(TRIPWIRE, measure=-1), "measure: must be between 1 and 64 (got -1)"),
    (lambda: pictl.train(TRIPWIRE, steps=-5), "steps: must be between 0 and 1000000 (got -5)"),
    (lambda: pictl.load_cluster(TRIPWIRE.source, cold="no"), "cold: must be True or False (got 'no')"),
])
def test_a_bad_value_is_named_as_the_caller_spelled_it(call: Callable[[], Any], message: str) -> None:
    assert message in _refused(call)
