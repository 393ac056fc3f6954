"""The `pictl` command: parses arguments, runs a session, maps errors to exit codes.

Exit codes: 0 ok, 1 internal error, 2 bad input or config (nothing started),
3 a run failed on a host, 4 a host could not be reached, 5 pipeline output differs
from the serial run, 6 a host is not ready (python, venv, packages: see `pictl check`
and `pictl provision`), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from pictl import errors as E
from pictl.inventory import Cluster, load_cluster
from pictl.profiles import available_profiles, resolve_options

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Pipeline-parallel inference on a small cluster.")
SHIPPED_HOSTS = Path(__file__).resolve().parent.parent / "hosts.toml"


def _fail(exc: E.PictlError) -> None:
    # One line, however long: scripts grep it, and a wrapped path is a broken path.
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"pictl: error: {exc}", markup=False)
    raise typer.Exit(exc.exit_code)


def _hosts_file(path: Path | None) -> Path:
    if path:
        return path
    local = Path.cwd() / "hosts.toml"
    return local if local.is_file() else SHIPPED_HOSTS


def _cluster(path: Path | None) -> Cluster:
    return load_cluster(_hosts_file(path))


async def _run_cancellable(coro: Any) -> Any:
    """Run `coro`, turning SIGINT/SIGTERM into task cancellation so cleanup code runs."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        raise E.Interrupted("interrupted: what was running on the hosts was stopped") from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file (default ./hosts.toml, else shipped).")] = None,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where run directories go.")] = None,
) -> None:
    """Without a command: the interactive dashboard (r run, s stop, t traces, / filter, h history, ? help, q quit)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        cluster = _cluster(hosts)
    except E.PictlError as exc:
        _fail(exc)
    from pictl.tui.app import PictlApp

    PictlApp(cluster, runs_root=runs_dir).run()


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


@app.command()
def run(
    stages: Annotated[Optional[int], typer.Option(help="Pipeline stages (1 = serial only).")] = None,
    split: Annotated[Optional[str], typer.Option(help="Split points: blocks.3,blocks.6 (stage starts).")] = None,
    policy: Annotated[Optional[str], typer.Option(help="balanced (default: measured costs) | equal | explicit")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Named preset from profiles/.")] = None,
    chunk: Annotated[Optional[int], typer.Option(help="Microbatch size.")] = None,
    images: Annotated[Optional[int], typer.Option(help="Images per pass.")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="Untimed warm-up passes.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed passes.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank.")] = None,
    model: Annotated[Optional[str], typer.Option(help="timm model name.")] = None,
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="State dict (.safetensors / .pth).")] = None,
    allow_pickle: Annotated[Optional[bool], typer.Option("--allow-pickle", help="Trust a pickled checkpoint.")] = None,
    data: Annotated[Optional[str], typer.Option(help="synthetic | cifar10 | cifar100 | imagefolder")] = None,
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory on the hosts.")] = None,
    atol: Annotated[Optional[float], typer.Option(help="Largest logit difference that still matches.")] = None,
    master_port: Annotated[Optional[int], typer.Option(help="Rendezvous port on host 0 (default: a free one).")] = None,
    trace_steps: Annotated[Optional[int], typer.Option(help="Profile K steps on every rank (extra untimed pass); "
                                                            "traces land in the run directory.")] = None,
    headless: Annotated[bool, typer.Option("--headless", help="No dashboard: progress on stderr.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file (default ./hosts.toml, else shipped).")] = None,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where run directories go.")] = None,
    fresh_baseline: Annotated[bool, typer.Option("--fresh-baseline", help="Measure the serial run again.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every host's output.")] = False,
) -> None:
    """Run one experiment: serial baseline, N-stage pipeline, speedup and output check."""
    from pictl.headless import HeadlessRenderer, print_summary
    from pictl.session import RunSession

    overrides = {"stages": stages, "split": _split(split), "policy": policy, "chunk": chunk, "images": images,
                 "warmup": warmup, "repeats": repeats, "threads": threads, "model": model,
                 "num_classes": num_classes, "checkpoint": checkpoint, "allow_pickle": allow_pickle, "data": data,
                 "data_path": data_path, "atol": atol, "master_port": master_port,
                 "trace_steps": trace_steps}
    renderer = HeadlessRenderer(verbose=verbose)
    session = None
    try:
        options = resolve_options(profile, overrides)
        session = RunSession(_cluster(hosts), options, on_event=renderer, runs_root=runs_dir,
                             reuse_baseline=not fresh_baseline, profile=profile)
        summary = asyncio.run(_run_cancellable(session.run()))
    except E.PictlError as exc:
        renderer.close()
        if session is not None and session.last_summary:
            print_summary(session.last_summary, as_json=as_json)
        _fail(exc)
    renderer.close()
    print_summary(summary, as_json=as_json)


@app.command()
def sweep(
    stages: Annotated[Optional[str], typer.Option(help="Stage counts, e.g. 1,2,3,4,6 (default 1,2,3,4).")] = None,
    chunks: Annotated[Optional[str], typer.Option(help="Microbatch sizes, e.g. 1,2,4,8 (default 1).")] = None,
    policy: Annotated[Optional[str], typer.Option(help="Policies to compare, e.g. equal,balanced.")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Preset: run options, and its [sweep] values.")] = None,
    images: Annotated[Optional[int], typer.Option(help="Images per pass.")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="Untimed warm-up passes.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed passes.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank.")] = None,
    trace_steps: Annotated[Optional[int], typer.Option(help="Profile K steps of every pipeline run.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Sweep directory (default: under the runs root).")] = None,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every host's output.")] = False,
) -> None:
    """Run every combination against shared serial baselines; write a table and plots."""
    import time

    from pictl.headless import HeadlessRenderer
    from pictl.runs import default_runs_root
    from pictl.sweep import plan_sweep, run_sweep

    renderer = HeadlessRenderer(verbose=verbose)
    try:
        cluster = _cluster(hosts)
        base, points = plan_sweep(cluster, profile, {"images": images, "warmup": warmup, "repeats": repeats,
                                                     "threads": threads, "trace_steps": trace_steps},
                                  stages=stages, chunks=chunks, policies=policy)
        target = out or default_runs_root().parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S")
        if target.exists():
            raise E.ConfigError(f"--out: {target} already exists")
        rows = asyncio.run(_run_cancellable(run_sweep(cluster, base, points, target, on_event=renderer)))
    except E.PictlError as exc:
        renderer.close()
        _fail(exc)
    renderer.close()
    Console(width=None if sys.stdout.isatty() else 160).print((target / "table.md").read_text(), markup=False)
    typer.echo(f"sweep directory: {target}")
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(E.EXIT_RUN_FAILED)


@app.command()
def prune(
    model: Annotated[Optional[str], typer.Option(help="timm ViT/DeiT to prune.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="Base weights (.safetensors / .pth state dict).")] = None,
    ratio: Annotated[Optional[float], typer.Option(help="Channel pruning ratio, in (0, 1).")] = None,
    importance: Annotated[Optional[str], typer.Option(help="l1 | l2 | taylor | hessian (default).")] = None,
    global_pruning: Annotated[Optional[bool], typer.Option("--global/--uniform",
                                                           help="Rank channels across layers.")] = None,
    prune_heads: Annotated[Optional[bool], typer.Option("--prune-heads", help="Remove whole heads.")] = None,
    round_to: Annotated[Optional[int], typer.Option(help="Keep widths multiples of N (e.g. 8 for SIMD).")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Fine-tuning epochs (0: none).")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (cosine schedule).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Fine-tuning batch size.")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="sgd (momentum) | adamw.")] = None,
    calib_batches: Annotated[Optional[int], typer.Option(help="Batches scoring taylor/hessian.")] = None,
    train_images: Annotated[Optional[int], typer.Option(help="Fine-tune on at most N images (0: all).")] = None,
    eval_images: Annotated[Optional[int], typer.Option(help="Evaluate on at most N images (0: all).")] = None,
    data: Annotated[Optional[str], typer.Option(help="cifar10 | cifar100 | imagefolder")] = None,
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory (on the machine that prunes).")] = None,
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs (default: the data set's).")] = None,
    model_arg: Annotated[Optional[list[str]], typer.Option(help="timm constructor argument KEY=VALUE.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (0: all cores).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed for data order and random weights.")] = None,
    on: Annotated[Optional[str], typer.Option(help="Prune on this inventory host (default: here).")] = None,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file (for --on).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Where job directories go.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the job's own output.")] = False,
) -> None:
    """Prune a ViT/DeiT (torch-pruning), fine-tune it, and write an artifact `pictl run --model` takes."""
    from pictl.headless import HeadlessRenderer, print_prune_summary
    from pictl.prune import PruneSession, parse_model_args, prune_options

    renderer = HeadlessRenderer(verbose=verbose)
    session = None
    try:
        options = prune_options({
            "model": model, "checkpoint": checkpoint, "ratio": ratio, "importance": importance,
            "global_pruning": global_pruning, "prune_heads": prune_heads, "round_to": round_to, "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size, "optimizer": optimizer, "calib_batches": calib_batches,
            "train_images": train_images, "eval_images": eval_images, "data": data, "data_path": data_path,
            "num_classes": num_classes, "model_args": parse_model_args(model_arg), "threads": threads,
            "device": device, "seed": seed})
        session = PruneSession(options, cluster=_cluster(hosts) if on else None, on_host=on, root=out,
                               on_event=renderer)
        summary = asyncio.run(_run_cancellable(session.run()))
    except E.PictlError as exc:
        renderer.close()
        if session is not None and session.summary and as_json:
            print_prune_summary(session.summary, as_json=True)
        _fail(exc)
    renderer.close()
    print_prune_summary(summary, as_json=as_json)


@app.command()
def report(
    sources: Annotated[list[Path], typer.Argument(help="Run and sweep directories.")],
    out: Annotated[Path, typer.Option(help="Where report.md and its charts go.")] = Path("pictl-report"),
) -> None:
    """A Markdown report: headline figures, per-stage breakdown chart, link bytes/s, sweep tables and plots."""
    from pictl.report import write_report

    try:
        path = write_report(sources, out)
    except E.PictlError as exc:
        _fail(exc)
    typer.echo(f"report: {path}")


@app.command("profiles")
def list_profiles() -> None:
    """List the run presets."""
    for name in available_profiles():
        typer.echo(name)


@app.command("hosts")
def list_hosts(hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None) -> None:
    """Show the inventory as pictl reads it."""
    try:
        cluster = _cluster(hosts)
    except E.PictlError as exc:
        _fail(exc)
    for h in cluster.hosts:
        port = f":{h.port}" if h.port else ""
        typer.echo(f"{h.name}\t{h.transport}\t{h.address}{port}\tslots={h.slots}\tworkdir={h.workdir}")


async def _with_transports(cluster: Cluster, work):  # noqa: ANN001, ANN202
    """Connect to every host in parallel, run `work(transports)`, always close."""
    from pictl.transport import raise_for_failures, transport_for

    transports = [transport_for(h) for h in cluster.hosts]
    try:
        results = await asyncio.gather(*(t.connect() for t in transports), return_exceptions=True)
        raise_for_failures(results, transports, "")
        return await work(transports)
    finally:
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)


@app.command()
def check(
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Is every host ready? Reachability, python, venv, packages, memory, heat, clock, network."""
    import json

    from pictl.check import check_cluster
    from pictl.headless import check_table

    try:
        checks = asyncio.run(check_cluster(_cluster(hosts)))
    except E.PictlError as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps({"ready": all(c.ready for c in checks), "hosts": [c.as_dict() for c in checks]}))
    else:
        Console(width=None if sys.stdout.isatty() else 160).print(check_table(checks))
    not_ready = [c for c in checks if not c.ready]
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    for c in not_ready:
        reason = c.error or "; ".join(c.problems)
        err.print(f"pictl: host '{c.host}' is not ready: {reason}", markup=False)
    if not_ready:
        raise typer.Exit(E.EXIT_UNREACHABLE if any(not c.reachable for c in not_ready) else E.EXIT_NOT_READY)


@app.command()
def push(hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None) -> None:
    """Sync remote/ and profiles/ to every host (only what changed)."""
    import time

    from pictl.push import push_all
    from pictl.transport import preload, raise_for_failures

    async def work(transports):  # noqa: ANN001, ANN202
        results = await push_all(transports)
        raise_for_failures(results, transports, "push failed")
        return results

    try:
        cluster = _cluster(hosts)
        preload(cluster)  # the timing below is the push, not Python importing asyncssh
        start = time.perf_counter()
        results = asyncio.run(_with_transports(cluster, work))
    except E.PictlError as exc:
        _fail(exc)
    for r in results:
        state = "up to date" if not (r.sent or r.removed) else f"sent {r.sent} file(s), {r.bytes_sent:,} bytes"
        typer.echo(f"{r.host}: {state}" + (f", removed {r.removed}" if r.removed else ""))
    typer.echo(f"pushed to {len(results)} host(s) in {time.perf_counter() - start:.2f}s")


@app.command()
def provision(
    wheels: Annotated[Optional[Path], typer.Option(help="Offline: install only from these wheels.")] = None,
    installer: Annotated[str, typer.Option(help="auto (uv when the host has it, else pip) | uv | pip")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Install again even when up to date.")] = False,
    extra_index_url: Annotated[Optional[str], typer.Option(help="Online: another index, e.g. CPU-only torch.")] = None,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every installer line.")] = False,
) -> None:
    """Create each host's venv and install the pinned torch stack (only where something changed)."""
    import time

    from pictl.provision import ProvisionError, Wheelhouse, provision_all

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    last_step: dict[str, str] = {}

    def progress(host: str, message: str) -> None:
        # Step changes always; installer lines only with -v (pip is chatty).
        step = message.split(":", 1)[0]
        if verbose or (message.endswith("...") and last_step.get(host) != step) or message.startswith("sending"):
            err.print(f"{host}: {message}", markup=False)
        last_step[host] = step

    async def work(transports):  # noqa: ANN001, ANN202
        return await provision_all(transports, Wheelhouse(wheels) if wheels else None, force=force,
                                   installer=installer, extra_index_url=extra_index_url, progress=progress)

    start = time.perf_counter()
    try:
        if installer not in ("auto", "uv", "pip"):
            raise E.ConfigError(f"--installer: '{installer}' is not one of auto, uv, pip")
        if wheels is not None and not wheels.is_dir():
            raise E.ConfigError(f"--wheels: {wheels} is not a directory")
        if wheels is not None and extra_index_url:
            raise E.ConfigError("--extra-index-url: offline (--wheels) installs use no index")
        cluster = _cluster(hosts)
        results = asyncio.run(_run_cancellable(_with_transports(cluster, work)))
    except E.PictlError as exc:
        _fail(exc)
    failures = []
    for host, r in zip(cluster.hosts, results, strict=True):
        if isinstance(r, BaseException):
            failures.append(r)
            err.print(f"pictl: error: {r if isinstance(r, E.PictlError) else f'host {host.name!r}: {r}'}",
                      markup=False, soft_wrap=True)
        elif r.state == "installed":
            typer.echo(f"{r.host}: installed with {r.installer} in {r.seconds:.1f}s")
        elif r.state == "skipped":
            typer.echo(f"{r.host}: uses the controller's Python (no venv configured), nothing to do")
        else:
            typer.echo(f"{r.host}: up to date")
    typer.echo(f"provisioned {len(results) - len(failures)} of {len(results)} host(s) "
               f"in {time.perf_counter() - start:.2f}s")
    if failures:
        codes = {f.exit_code if isinstance(f, E.PictlError) else E.EXIT_INTERNAL for f in failures}
        raise typer.Exit(E.EXIT_UNREACHABLE if E.EXIT_UNREACHABLE in codes else
                         ProvisionError.exit_code if ProvisionError.exit_code in codes else max(codes))


@app.command()
def wheels(
    dest: Annotated[Path, typer.Argument(help="Directory to fill with wheels (created if missing).")],
    platform: Annotated[str, typer.Option(help="Host CPU: aarch64 (Raspberry Pi 4/5), armv7l or x86_64.")] = "aarch64",
    python_version: Annotated[str, typer.Option(help="The hosts' python, e.g. 3.11.")] = "3.11",
    extra_index_url: Annotated[Optional[str], typer.Option(help="Another index, e.g. a CPU-only torch one.")] = None,
) -> None:
    """Gather the pinned requirements as wheels for the hosts' platform (for `provision --wheels`)."""
    from pictl.wheels import gather_wheels

    try:
        files = gather_wheels(dest, platform=platform, python_version=python_version,
                              extra_index_url=extra_index_url)
    except E.PictlError as exc:
        _fail(exc)
    typer.echo(f"{len(files)} wheel(s) in {dest} ({sum(f.stat().st_size for f in files) / 1e6:.0f} MB)")


@app.command("profile")
def profile_costs(
    model: Annotated[str, typer.Option(help="timm model name.")] = "deit_small_patch16_224",
    num_classes: Annotated[int, typer.Option(help="Classifier outputs.")] = 1000,
    chunk: Annotated[int, typer.Option(help="Microbatch size to time.")] = 1,
    threads: Annotated[int, typer.Option(help="torch threads, as the run will use.")] = 1,
    fresh: Annotated[bool, typer.Option("--fresh", help="Measure again even if cached.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The profiles as one JSON object on stdout.")] = False,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
) -> None:
    """Measure each piece's time on every host and the bytes at each cut (what `--policy balanced` uses)."""
    import json
    import tempfile

    from rich.table import Table

    from pictl.baseline import default_cache_root
    from pictl.cache import JsonCache
    from pictl.costs import host_profiles, link_profiles
    from pictl.push import push_all
    from pictl.transport import raise_for_failures

    async def work(transports):  # noqa: ANN001, ANN202
        raise_for_failures(await push_all(transports), transports, "push failed")
        root = Path(tempfile.mkdtemp()) if fresh else default_cache_root().parent
        found = await host_profiles(transports, JsonCache(root / "costs"), model=model, num_classes=num_classes,
                                    chunk=chunk, threads=threads)
        return found, await link_profiles(list(zip(transports, transports[1:], strict=False)),
                                          JsonCache(root / "links"))

    try:
        cluster = _cluster(hosts)
        (profiles, measured), (links, links_measured) = asyncio.run(
            _run_cancellable(_with_transports(cluster, work)))
    except E.PictlError as exc:
        _fail(exc)
    link_rows = {f"{a}->{b}": {"latency_ms": round(k.latency_s * 1000, 3), "MB_per_s": round(k.bytes_per_s / 1e6, 1)}
                 for (a, b), k in links.items()}
    if as_json:
        typer.echo(json.dumps({"measured": measured, "hosts": profiles, "links": link_rows,
                               "links_measured": links_measured}))
        return
    names = list(profiles)
    table = Table(title=f"{model}: ms per microbatch of {chunk} ({threads} thread(s)); cached unless measured now",
                  title_justify="left")
    for col in ["piece", "KB in", *(f"{n} ms" for n in names)]:
        table.add_column(col, justify="left" if col == "piece" else "right")
    first = profiles[names[0]]
    for i, piece in enumerate(first["pieces"]):
        table.add_row(piece, f"{first['cut_bytes'][i] / 1024:.0f}",
                      *(f"{profiles[n]['compute_s'][i] * 1000:.2f}" for n in names))
    table.add_row("total", "", *(f"{sum(profiles[n]['compute_s']) * 1000:.1f}" for n in names))
    # > 1: the host cannot keep up its burst speed (a CPU quota, thermal throttling); times include it.
    table.add_row("sustained / burst", "", *(f"{profiles[n].get('sustained_scale', 1.0):.2f}x" for n in names))
    out = Console(width=None if sys.stdout.isatty() else 160)
    out.print(table)
    hops = Table(title="links (host to next host, as a stage's output travels)", title_justify="left")
    for col in ("link", "latency ms", "MB/s", ""):
        hops.add_column(col)
    for name, row in link_rows.items():
        hops.add_row(name, f"{row['latency_ms']:.3f}", f"{row['MB_per_s']:.1f}",
                     "measured now" if name in links_measured else "cached")
    out.print(hops)
    typer.echo(f"measured now: {', '.join(measured) or 'none (all cached)'}")


@app.command()
def traces(
    run: Annotated[Optional[str], typer.Argument(help="Run id or directory (default: the run in progress).")] = None,
    steps: Annotated[int, typer.Option(help="Pipeline steps to profile on every rank.", min=1)] = 8,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each rank's trace.")] = 120.0,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where run directories are.")] = None,
) -> None:
    """Profile K steps on every rank of a running pipeline, download the traces and merge them."""
    from pictl.runs import default_runs_root
    from pictl.traces import grab_from_outside, live_run

    try:
        path = live_run(runs_dir or default_runs_root(), run)
        grab = asyncio.run(_run_cancellable(grab_from_outside(path, steps, timeout)))
    except E.PictlError as exc:
        _fail(exc)
    for rank, file in sorted(grab.files.items()):
        share = grab.per_rank.get(rank, {})
        typer.echo(f"rank {rank}: {file}  compute {share.get('compute_pct')}%  send {share.get('send_pct')}%  "
                   f"recv-wait {share.get('recv_wait_pct')}%  idle {share.get('idle_pct')}%")
    for rank, why in sorted(grab.missing.items()):
        typer.echo(f"rank {rank}: missing: {why}", err=True)
    if grab.timeline:
        typer.echo(f"timeline: {grab.timeline}")
    if not grab.files:
        raise typer.Exit(E.EXIT_RUN_FAILED)


@app.command()
def stop(hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None) -> None:
    """Stop every process pictl's runs left on the hosts (SIGTERM, then SIGKILL)."""
    from pictl.launch import cleanup_host

    async def work(transports):  # noqa: ANN001, ANN202
        return await asyncio.gather(*(cleanup_host(t, orphans_only=False) for t in transports),
                                    return_exceptions=True)

    try:
        cluster = _cluster(hosts)
        results = asyncio.run(_with_transports(cluster, work))
    except E.PictlError as exc:
        _fail(exc)
    failed = False
    for host, res in zip(cluster.hosts, results, strict=True):
        if isinstance(res, BaseException):
            failed = True
            typer.echo(f"{host.name}: {res}", err=True)
        else:
            typer.echo(f"{host.name}: stopped {len(res['stopped'])} process group(s)"
                       + (f", {len(res['kept'])} not ours" if res["kept"] else ""))
    if failed:
        raise typer.Exit(E.EXIT_UNREACHABLE)


@app.command()
def trust(
    host: Annotated[str, typer.Argument(help="Host name from the inventory.")],
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
) -> None:
    """Trust a host's SSH key: fetch it and add it to the host's known_hosts file."""
    from pictl.transport.ssh import trust_host

    try:
        h = _cluster(hosts).host(host)
        known = Path(h.known_hosts or "~/.ssh/known_hosts").expanduser()
        fingerprint = asyncio.run(trust_host(h.address, h.port, known))
    except E.PictlError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(E.TransportError(f"host '{host}' ({h.address}): unreachable ({exc})"))
    typer.echo(f"trusted {host} ({h.address}): {fingerprint}, added to {known}")


def entrypoint() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(E.EXIT_INTERRUPTED)
