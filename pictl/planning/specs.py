"""Run specs and their stage plans: what the hosts are told, and the plans cached on the controller.

A plan comes from `remote.runtime.plan` on a run's first host (it builds the model on the
meta device, so it imports torch and timm: 8-16 s on a slow host). When no file
on the hosts is involved a plan is a pure function of the spec, so it is cached;
`plan_ahead` plans a sweep's runs in one process before the first starts.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from pictl import errors as E
from pictl.cluster.artifacts import Artifact
from pictl.cluster.commands import python_module, worker_env
from pictl.cluster.jobs import HostJob, to_the_end
from pictl.cluster.push import local_tree, manifest_digest
from pictl.events import command_outcome, parse_event
from pictl.inventory import Cluster, Host
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages
from pictl.records.cache import JsonCache
from pictl.records.cache import cache_root as default_cache_root
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.records import to_wire
from remote.floor.run_records import Plan
from remote.floor.spec import DataSpec, RunSpec, factory_of, hf_model_dir


def spec_from(options: RunOptions, run_id: str, artifact: Artifact | None) -> RunSpec:
    return RunSpec(
        model=options.model, num_classes=options.num_classes, tokens=options.tokens, seed=options.seed,
        checkpoint=artifact.run_relative_path if artifact else options.checkpoint,
        # `balanced` is decided on the controller: the hosts receive its split points as explicit ones.
        allow_pickle=options.allow_pickle, stages=options.stages, replicas=options.replicas,
        policy="equal" if options.policy == "balanced" else options.policy,
        split_points=list(options.split), chunk=options.chunk, images=options.images, warmup=options.warmup,
        repeats=options.repeats, threads=options.threads,
        data=DataSpec(kind=options.data, path=options.data_path, split=options.data_split),
        # A lossy wire is judged by top-1 agreement over every image: all their logits are compared.
        # So is the fp32 reference of other numerics (`--numerics`).
        check_images=options.images if options.lossy_wire or options.numerics != "fp32"
        else min(options.check_images, options.images),
        pg_timeout_s=options.pg_timeout_s, wire=options.wire, numerics=options.numerics, slowdown=options.slowdown,
        trace_steps=options.trace_steps if options.ranks > 1 else 0,
        run_id=run_id)


def plans_cache(root: Path) -> JsonCache:
    """Plans, under the cache root (`records.cache.cache_root`, or the one a run was given)."""
    return JsonCache(root / "plans")


def plan_key(host: Host, spec: RunSpec, *, code: str) -> str | None:
    """The cache key of `spec`'s plan on `host` with the pushed tree `code`, or None when the plan must be
    made every time."""
    if spec.checkpoint or spec.data.kind != "synthetic" or hf_model_dir(spec.model) or factory_of(spec.model):
        return None  # planning also checks files on the hosts: do it every time
    return JsonCache.key({"model": spec.model, "num_classes": spec.num_classes, "tokens": spec.tokens,
                          "stages": spec.stages,
                          "policy": spec.policy, "split": list(spec.split_points), "chunk": spec.chunk,
                          "images": spec.images, "host": [host.name, host.address, host.python_path()],
                          "code": code})


async def plan_ahead(cluster: Cluster, runs: list[tuple[str, RunOptions]], *,
                     cache_root: Path | None = None) -> int:
    """Plan every run in `runs` (label, options) whose plan can be cached and is not, in one `remote.runtime.plan`
    process per first host, and cache the plans: each run's session then finds its plan, which saves a
    torch import per run, and a run whose spec cannot work is refused before any run starts
    (ConfigError: "<label>: <why>"). `balanced` runs are left out: their split is chosen at run time.
    Returns how many plans were made."""
    plans = plans_cache(cache_root or default_cache_root())
    tree = local_tree()
    code = manifest_digest(tree)
    todo: dict[str, tuple[Host, list[tuple[str, RunSpec, str]]]] = {}
    seen: set[str] = set()
    for label, options in runs:
        if (options.policy == "balanced" and options.stages > 1) or options.artifact:
            continue
        host = place_stages(cluster, options.ranks)[0].host
        spec = spec_from(options, "plan-ahead", None)
        key = plan_key(host, spec, code=code)
        if key and key not in seen and not plans.get(key):
            seen.add(key)
            todo.setdefault(host.name, (host, []))[1].append((label, spec, key))
    made = 0
    for host, items in todo.values():
        made += await _plan_on(host, items, plans, tree)
    return made


async def _plan_on(host: Host, items: list[tuple[str, RunSpec, str]], plans: JsonCache,
                   tree: dict[str, bytes]) -> int:
    planned = await _plans_on(host, [(label, spec) for label, spec, _ in items], tree, "plan-ahead")
    for (_, _, key), plan in zip(items, planned, strict=True):
        plans.put(key, to_wire(replace(plan, spec_file=None)))
    return len(planned)


async def _plans_on(host: Host, items: list[tuple[str, RunSpec]], tree: dict[str, bytes], what: str) -> list[Plan]:
    """Each spec's plan, made on `host` in one planning process; the first spec that cannot work is an error
    naming its label (ConfigError for bad input, else RunFailed)."""
    # A lease-less job (it runs nothing that measures): connected and pushed through the one job lifecycle, its
    # directory removed whatever happens (best effort: a host that could not be reached has nothing to remove).
    job = HostJob([host], f"{what}-{time.strftime('%Y%m%d-%H%M%S')}-{id(items):x}")
    t, work_dir = job.transport(host), job.run_dir(host)
    try:
        await job.connect()
        await job.push(tree)
        names = [f"spec-{i}.json" for i in range(len(items))]
        for name, (_, spec) in zip(names, items, strict=True):
            await t.put_bytes(spec.to_json().encode(), f"{work_dir}/{name}")
        argv = python_module(host, entries.PLAN.module, *(a for n in names for a in ("--spec", n)))
        result = await t.run(argv, cwd=work_dir, env=worker_env(host, 1), timeout_s=300 + 10 * len(items))
    finally:
        await to_the_end(job.close(tidy=lambda tr: tr.remove_tree(work_dir)))
    planned: dict[str, Plan] = {}
    for event in filter(None, map(parse_event, result.stdout.splitlines())):
        if isinstance(event, Plan) and event.spec_file in names:
            planned[event.spec_file] = event
    if len(planned) < len(items):
        label = next(lbl for name, (lbl, _) in zip(names, items, strict=True) if name not in planned)
        _, message = command_outcome(result, Plan) if result.returncode else (None, "no plan")
        if result.returncode == P.EXIT_BAD_INPUT:
            raise E.ConfigError(f"{label}: {message}")
        raise E.RunFailed(f"host '{host.name}': planning failed: {message}")
    return [planned[name] for name in names]


async def model_cuts(cluster: Cluster, options: RunOptions) -> list[str]:
    """Every place `options`' model can be split (a stage may begin at any of them), as the first host plans it:
    `pictl run --list-splits`."""
    host = place_stages(cluster, 1)[0].host
    spec = spec_from(options.model_copy(update={"stages": 1, "replicas": 1, "policy": "equal", "split": ()}),
                     "list-splits", None)
    (plan,) = await _plans_on(host, [("--list-splits", spec)], local_tree(options.model), "list-splits")
    return list(plan.cuts or [])
