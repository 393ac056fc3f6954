"""The layering holds: every module of both packages, read from the tree, imports only what its layer may.

pictl/, bottom to top (a module may import its own layer and the ones below):
    ground      pictl, errors, inventory, events, summary, records/   (typed contracts, config, run records)
    cluster     cluster/                                              (hosts: transports, fleet, push, leases...)
    planning    planning/                                             (presets, placement, costs, specs)
    run         run/                                                  (one run as a line of phases)
    jobs        jobs/                                                 (sweeps and prunes, built on runs)
    frontends   headless, tui/                                        (render events; Textual only in tui/)
    cli         cli/, __main__
Of remote/, the controller imports only the torch-free floor, `remote/floor/` (named exactly in FLOOR).
remote/, bottom to top: the floor; data/ and host/; toolkit/ (the model as pieces and stages, what
every tool builds on); runtime/ (the inference pipeline), profiling/, pruning/ and training/.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PICTL_LAYERS = [
    ("ground", ["pictl", "pictl.errors", "pictl.inventory", "pictl.events", "pictl.summary", "pictl.summary_models",
                "pictl.job_summaries", "pictl.records", "pictl.text", "pictl.console"]),
    ("cluster", ["pictl.cluster"]),
    ("planning", ["pictl.planning"]),
    ("run", ["pictl.run"]),
    ("jobs", ["pictl.jobs"]),
    ("frontends", ["pictl.headless", "pictl.headless_train", "pictl.headless_prune", "pictl.headless_check",
                   "pictl.headless_generate",
                   "pictl.tui", "pictl.api"]),
    ("cli", ["pictl.cli", "pictl.__main__"]),
]
REMOTE_LAYERS = [
    ("floor", ["remote", "remote.floor"]),
    ("data and host", ["remote.data", "remote.host"]),
    ("toolkit", ["remote.toolkit"]),
    ("tools", ["remote.runtime", "remote.profiling", "remote.pruning", "remote.training", "remote.generation"]),
]
FLOOR = {f"remote.floor.{m}" for m in (
    "protocol", "records", "run_records", "job_records", "spec", "errors", "emit", "artifact_meta", "wire",
    "entries", "torch_support",  # the contracts
    "balance", "refinement", "recut",  # the solvers
    "nofollow",  # files
)} | {"remote.floor"}
"""The torch-free floor, exactly: the only part of remote/ the controller imports (and `remote` itself, whose
`source()` reads a stdlib host helper's text)."""
REMOTE_FLOOR = REMOTE_LAYERS[0][1]


def modules(package: str) -> dict[str, Path]:
    """Every module of `package`, by dotted name, from the files in the tree."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer_of(name: str, layers: list[tuple[str, list[str]]]) -> int:
    best = max(((i, len(prefix)) for i, (_, prefixes) in enumerate(layers) for prefix in prefixes
                if name == prefix or name.startswith(prefix + ".")), key=lambda x: x[1], default=None)
    assert best is not None, f"{name} belongs to no layer: place it in tests/unit/test_architecture.py"
    return best[0]


def imports(path: Path, name: str) -> set[str]:
    """Modules `path` imports (absolute, and relative resolved), at any depth of the file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pictl import errors`
    return out


def _violations(package: str, layers: list[tuple[str, list[str]]], own: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in own.items():
        mine = layer_of(name, layers)
        for target in imports(path, name):
            if target in own and layer_of(target, layers) > mine:
                bad.append(f"{name} ({layers[mine][0]}) imports {target} ({layers[layer_of(target, layers)][0]})")
            if package == "pictl" and target.startswith("remote.") and layer_of(target, REMOTE_LAYERS) > 0:
                bad.append(f"{name} imports {target}: the controller may import only remote's floor")
    return bad


def test_every_module_has_a_layer_and_no_import_runs_up() -> None:
    pictl, remote = modules("pictl"), modules("remote")
    assert len(pictl) > 40 and len(remote) > 25  # the tree was read
    bad = _violations("pictl", PICTL_LAYERS, pictl) + _violations("remote", REMOTE_LAYERS, remote)
    assert not bad, "\n".join(bad)


def test_no_import_circle() -> None:
    for package in ("pictl", "remote"):
        own = modules(package)
        graph = {n: {t for t in imports(p, n) if t in own and t != n} for n, p in own.items()}
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as exc:
            raise AssertionError(f"import circle in {package}: {' -> '.join(exc.args[1])}") from None


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for pkg in ("pictl", "remote") for p in modules(pkg).values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_controller_imports_neither_torch_nor_textual_outside_the_dashboard() -> None:
    core = [n for n in modules("pictl") if not n.startswith("pictl.tui") and n != "pictl.__main__"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in core) +
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'textual'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "", f"the controller's core pulled in: {out.stdout.strip()}"


def test_the_dashboard_is_the_only_textual_code_and_holds_no_torch() -> None:
    """The app may import Textual; it must still not pull in torch (it runs on the controller)."""
    code = ("import sys\nimport pictl.tui.app\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
    users = sorted(n for n, p in modules("pictl").items()
                   if any(t == "textual" or t.startswith("textual.") for t in imports(p, n)))
    assert users and all(u.startswith("pictl.tui") for u in users), users


def test_the_floor_is_exactly_the_named_modules_and_imports_nothing_above_it() -> None:
    """remote/floor/ holds the named modules and no other; they import neither torch nor pictl nor any other
    part of remote/, at any depth of the file; and the controller imports nothing of remote/ outside it."""
    remote = modules("remote")
    assert {n for n in remote if n.startswith("remote.floor")} == FLOOR
    for name in sorted(FLOOR):
        above = sorted(t for t in imports(remote[name], name) if t.split(".")[0] in ("torch", "pictl", "timm")
                       or (t.startswith("remote.") and not t.startswith("remote.floor")))
        assert not above, f"{name} imports {above}"
    pictl = modules("pictl")
    outside = sorted({t for n, p in pictl.items() for t in imports(p, n)
                      if t.startswith("remote.") and not t.startswith("remote.floor") and t != "remote.source"})
    assert not outside, outside


def test_event_names_are_shared_constants() -> None:
    from remote.floor import protocol

    assert len(set(protocol.EVENTS)) == len(protocol.EVENTS)


def test_benchmarks_are_a_package_that_edits_no_import_path() -> None:
    """bench/ runs as modules from the repository root (`python -m bench.NAME`): the project and its test
    support import by their names, so no script puts a directory of its own on `sys.path`."""
    editing = [p.name for p in sorted((ROOT / "bench").glob("*.py")) if "sys.path" in p.read_text()]
    assert not editing, f"bench scripts that edit sys.path: {editing}"
