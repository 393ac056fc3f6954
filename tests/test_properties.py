"""Property tests: whatever a hosts.toml or a profile holds, pictl answers with a Cluster / RunOptions or
one of its own errors (a ConfigError naming the file), never another exception (a traceback)."""

from __future__ import annotations

import datetime
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pictl.errors import ConfigError
from pictl.inventory import Cluster, Host, load_cluster
from pictl.planning.profiles import RunOptions, SweepSettings, resolve_options, sweep_settings

# 300 examples each (a few seconds); PICTL_PROPERTY_EXAMPLES=5000 for a longer search by hand.
SETTINGS = settings(max_examples=int(os.environ.get("PICTL_PROPERTY_EXAMPLES", "300")), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
WORK = Path(tempfile.mkdtemp(prefix="pictl-properties-"))


def _string(s: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_document(doc: dict[str, Any]) -> str:
    """Everything as top-level `key = value` lines: inline tables and arrays of them parse as [t] and [[t]]."""
    return "".join(f"{_string(k)} = {toml_value(v)}\n" for k, v in doc.items())


scalars = st.one_of(
    st.text(max_size=20), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(),
    st.floats(), st.dates(),
    st.sampled_from(["", "0", "22", "~/pictl", "../../..", "/proc/x", "eth0", "lo", "serial", "local", "ssh",
                     "h0", "a b", "$(touch /tmp/x)", "x" * 300]),
    st.integers(min_value=-2, max_value=70000))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def tables(fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Tables whose keys are mostly the real field names, with values of any type."""
    return st.dictionaries(st.one_of(st.sampled_from(fields), st.text(max_size=8)), values, max_size=8)


host_fields = list(Host.model_fields)
inventories = st.fixed_dictionaries({}, optional={
    "cluster": st.one_of(tables(["name"]), values),
    "defaults": st.one_of(tables(host_fields), values),
    "host": st.one_of(st.lists(st.one_of(tables(host_fields), values), max_size=5), values),
    "extra": values,
})


def _check_cluster(path: Path) -> None:
    try:
        cluster = load_cluster(path)
    except ConfigError as exc:
        assert str(exc).startswith(str(path)), exc  # the error names the file
        assert "\n" not in str(exc)
        return
    assert isinstance(cluster, Cluster) and cluster.hosts


@SETTINGS
@given(doc=inventories)
def test_any_inventory_document_gives_a_cluster_or_a_config_error(doc: dict[str, Any]) -> None:
    path = WORK / "hosts.toml"
    path.write_text(toml_document(doc))
    _check_cluster(path)


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_any_bytes_as_an_inventory_give_a_config_error(raw: bytes) -> None:
    path = WORK / "raw-hosts.toml"
    path.write_bytes(raw)
    _check_cluster(path)


profiles = st.fixed_dictionaries({}, optional={
    **{name: values for name in RunOptions.model_fields},
    "description": values,
    "sweep": st.one_of(tables(list(SweepSettings.model_fields)), values),
})


@SETTINGS
@given(doc=st.one_of(profiles, tables([*RunOptions.model_fields, "sweep"])),
       flags=st.fixed_dictionaries({}, optional={"images": st.integers(-5, 5000), "split": st.lists(st.text())}))
def test_any_profile_document_gives_options_or_a_config_error(doc: dict[str, Any], flags: dict[str, Any]) -> None:
    folder = WORK / "profiles"
    folder.mkdir(exist_ok=True)
    (folder / "generated.toml").write_text(toml_document(doc))
    for attempt in (lambda: resolve_options("generated", flags, extra=folder),
                    lambda: sweep_settings("generated", extra=folder)):
        try:
            result = attempt()
        except ConfigError as exc:
            assert "\n" not in str(exc)
            continue
        assert isinstance(result, RunOptions | SweepSettings)


@SETTINGS
@given(name=st.one_of(st.sampled_from(["../outside", "./../outside", "..", "/etc/passwd", "quick/../../outside",
                                       "quick\n", "lab6\n\n"]),
                      st.text(max_size=30)))
def test_any_profile_name_is_looked_up_by_name_only(name: str) -> None:
    """`--profile ../x` or an absolute path never reads a file outside the profile directories."""
    folder = WORK / "profiles"
    folder.mkdir(exist_ok=True)
    (WORK / "outside.toml").write_text("images = 3\n")
    try:
        options = resolve_options(name, {}, extra=folder)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert "/" not in name and options.images != 3
