"""Property tests: whatever a hosts.toml or a profile holds, pictl answers with a Cluster / RunOptions or
one of its own errors (a ConfigError naming the file), never another exception (a traceback); whatever a
run record holds, the readers of records (`runs`, `runs show`, `runs compare`, `report`) answer with a
result or one error line, print no control character, and write nothing outside `--out`."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pictl.errors import ConfigError
from pictl.inventory import Cluster, Host, load_cluster
from pictl.planning.options import RunOptions
from pictl.planning.presets import SweepSettings, resolve_options, sweep_settings

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


# -- run records ---------------------------------------------------------------------------------------------
# Whatever a run directory's summary.json holds, `runs`, `runs show`, `runs compare` and `report` answer with
# exit 0 or one of pictl's own errors (2), never a bug (1) or a traceback; nothing they print carries a control
# character, `--json` is strict JSON, and `report` writes nothing outside `--out`.

RECORD_SETTINGS = settings(max_examples=int(os.environ.get("PICTL_RECORD_EXAMPLES", "40")), deadline=None,
                           database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
BASE_SUMMARY: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "support" / "data" / "run_summary_two_stages.json").read_text())
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
DEEP = "@@deep:"
"""A generated value that stands for JSON nested that many levels (json.dumps could not write it)."""

odd_strings = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x1b]52;c;aGk=\x07", "\x9b31m", "[/]", "[bold]x",
                     "deit[pruned-0.3]", "../../x", "/etc/passwd", ".", "..", "", "$\\frac{1}{0}$", "a\nb", "\x00",
                     "\u202eevil", "\ud800", ":smile:", "x" * 3000, "ok", "failed", "interrupted", "blocks.6"]))
numbers = st.one_of(st.integers(), st.floats(), st.integers(min_value=-(10**40), max_value=10**40),
                    st.sampled_from([0, -1, 1, 2**63, -(2**63) - 1, 10**300, 1e308, 1.5e300, 253402300800.0]))
leaves = st.one_of(odd_strings, numbers, st.booleans(), st.none(),
                   st.integers(min_value=60, max_value=3000).map(lambda n: f"{DEEP}{n}"))
record_values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(odd_strings, st.sampled_from(["rank", "host", "code"])),
                                                 inner, max_size=3)), max_leaves=8)
RECORD_PATHS = ([(k,) for k in BASE_SUMMARY] + [("per_stage", 0, k) for k in BASE_SUMMARY["per_stage"][0]]
                + [("per_stage", 1, "rank"), ("per_stage", 0), ("baseline", "host"), ("baseline", "age_s"),
                   ("flags", 0, "code"), ("flags", 0, "message"), ("flags", 0), ("wire",), ("traces",),
                   ("traces", 0), ("error",), ("error", "message"), ("refine",), ("artifact",), ("x",)])
GRAB = {"directory": "d", "timeline": "t.json", "per_rank": {"0": {"compute_pct": 50.0, "send_pct": 1.0,
                                                                   "recv_wait_pct": 2.0, "idle_pct": 47.0}}}
mutations = st.lists(st.tuples(st.sampled_from(["set", "delete"]), st.sampled_from(RECORD_PATHS), record_values),
                     min_size=1, max_size=3)


def _mutate(doc: dict[str, Any], changes: list[tuple[str, tuple[Any, ...], Any]]) -> dict[str, Any]:
    """The base summary with each change applied where its path exists (a path that does not is skipped)."""
    doc = json.loads(json.dumps(doc))
    doc["traces"] = [dict(GRAB)]
    for how, path, value in changes:
        parent: Any = doc
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        last = path[-1]
        if isinstance(parent, dict) or (isinstance(parent, list) and isinstance(last, int) and last < len(parent)):
            if how == "delete":
                if isinstance(parent, dict):
                    parent.pop(last, None)
                else:
                    parent.pop(last)
            else:
                parent[last] = value
    return doc


def _record_text(doc: Any) -> str:
    text = json.dumps(doc)
    return re.sub(f'"{DEEP}(\\d+)"', lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), text)


records = st.one_of(
    st.just(BASE_SUMMARY).map(lambda d: _record_text(_mutate(d, []))),
    mutations.map(lambda m: _record_text(_mutate(BASE_SUMMARY, m))),
    st.dictionaries(st.sampled_from(["schema", "status", "run_id", "stages", "per_stage", "speedup", "started_at",
                                     "flags", "traces", "baseline"]), record_values, max_size=6).map(_record_text),
    st.binary(max_size=80).map(lambda b: b.decode("utf-8", "surrogateescape")))


def _invoke(args: list[str]) -> Any:
    from typer.testing import CliRunner

    from pictl.cli import app

    return CliRunner().invoke(app, args, env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "200"})


def _no_constant(name: str) -> None:
    pytest.fail(f"{name} in --json output: not strict JSON")


def _all_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@RECORD_SETTINGS
@given(text=records)
def test_any_run_record_is_read_or_refused_by_every_reader(text: str) -> None:
    work = Path(tempfile.mkdtemp(dir=WORK, prefix="records-"))
    try:
        runs, out = work / "runs", work / "a" / "out"
        good, bad = runs / "20261124-100000-s2-good", runs / "20261124-110000-s2-bad"
        for run, body in ((good, json.dumps(BASE_SUMMARY)), (bad, text)):
            run.mkdir(parents=True)
            (run / "summary.json").write_bytes(body.encode("utf-8", "surrogatepass"))
        before = _all_files(work)
        for args in (["runs", "--json"], ["runs"], ["runs", "show", bad.name], ["runs", "show", str(bad), "--json"],
                     ["runs", "compare", good.name, bad.name], ["runs", "compare", good.name, bad.name, "--json"],
                     ["runs", "export"], ["report", str(bad), "--out", str(out)]):
            result = _invoke([*args, "--runs-dir", str(runs)])
            assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
            assert result.exit_code in (0, 2), (args, result.exit_code, result.stderr)
            for stream in (result.stdout, result.stderr):
                assert not TERMINAL_CONTROL.search(stream), (args, stream[:3000])
            if result.exit_code == 2:
                errors = [line for line in result.stderr.splitlines() if line.startswith("pictl: error: ")]
                assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr
            if "--json" in args and result.exit_code == 0:
                json.loads(result.stdout, parse_constant=_no_constant)
            if args[:2] == ["runs", "--json"]:
                assert good.name in {Path(r["run_dir"]).name for r in json.loads(result.stdout)}  # the sibling stays
        written = _all_files(work) - before
        assert all(out in p.parents for p in written if p not in (out, out.parent)), written
        assert not [p for p in out.glob(".*")], "a temporary file was left in --out"
    finally:
        shutil.rmtree(work, ignore_errors=True)
