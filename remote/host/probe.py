"""What pictl learns about a host (stdlib only; runs before any venv exists).

    python probe.py report --venv PATH [--interface IF] [--connect ADDR:PORT]   # `pictl check`
    python probe.py state --venv PATH [--sample-s S] [--checkpoint F --base-dir D --hash-cache FILE]
    python probe.py listen     # prints a free port, accepts connections until stdin closes
    python probe.py clock      # answers each line on stdin with this host's clock (NTP-style exchanges)

`report` and `state` print one JSON object. `state` is what a run needs before its
serial baseline, in one round trip: the host's state (load, CPUs and quota,
governor and frequency, temperature and throttling), the venv's package
versions and the checkpoint's content hash (cached on the host by path, size and
mtime). Nothing here imports torch: package versions are read from the venv's
metadata, which takes milliseconds.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("torch", "torchvision", "timm", "transformers")


def _venv(path: str) -> dict:
    python = Path(os.path.expanduser(path)) / "bin" / "python"
    if not python.exists():
        return {"exists": False}
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(p):\n    try:\n        return m.version(p)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            f"print(json.dumps({{'python': sys.version.split()[0], 'packages': {{p: v(p) for p in {PACKAGES!r}}}}}))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=30, check=True)
        # (its last line: whatever the interpreter prints before running us, a site hook or a banner, is not it)
        return {"exists": True, **json.loads((out.stdout.strip().splitlines() or [""])[-1])}
    except (subprocess.SubprocessError, ValueError, OSError, TypeError) as exc:
        return {"exists": True, "error": str(exc)[:200]}


def _mem_available_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _temperature_c() -> float | None:
    try:
        return int(Path("/sys/class/thermal/thermal_zone0/temp").read_text()) / 1000.0
    except (OSError, ValueError):
        return None


def _throttled() -> str | None:
    """Raspberry Pi firmware's throttling flags (0x0: never throttled), where vcgencmd exists."""
    if not shutil.which("vcgencmd"):
        return None
    try:
        out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=5).stdout
        return out.strip().split("=", 1)[-1] or None
    except (subprocess.SubprocessError, OSError):
        return None


def _interface(name: str | None) -> dict | None:
    if not name:
        return None
    if not Path(f"/sys/class/net/{name}").exists():
        return {"name": name, "exists": False}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        return {"name": name, "exists": True, "address": socket.inet_ntoa(raw[20:24])}
    except OSError:
        return {"name": name, "exists": True, "address": None}


def _reach(target: str | None) -> dict | None:
    if not target:
        return None
    addr, _, port = target.rpartition(":")
    start = time.monotonic()
    try:
        socket.create_connection((addr, int(port)), timeout=3).close()
        return {"target": target, "ok": True, "ms": round((time.monotonic() - start) * 1000, 1)}
    except OSError as exc:
        return {"target": target, "ok": False, "error": str(exc)}


def report(args: argparse.Namespace) -> dict:
    started = time.time()
    return {"time_start": started, **_report(args), "time_end": time.time()}


def _report(args: argparse.Namespace) -> dict:
    return {
        "python": platform.python_version(), "python_ok": sys.version_info >= (3, 11),
        "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)), "cpus_online": os.cpu_count(),
        "cpu_list": pinned(), "cpu_quota": _cpu_quota(), "mem_available_mb": _mem_available_mb(),
        "temperature_c": _temperature_c(), "throttled": _throttled(), "venv": _venv(args.venv),
        "interface": _interface(args.interface), "rendezvous": _reach(args.connect),
    }


def _cpu_line(cores: set[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies over `cores`, from /proc/stat's per-CPU lines."""
    busy = total = 0
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line[:3] != "cpu" or not line[3:4].isdigit():
                    continue
                name, *fields = line.split()
                if int(name[3:]) in cores:
                    values = [int(v) for v in fields]
                    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
                    busy, total = busy + sum(values) - idle, total + sum(values)
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def _procs_running() -> int | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def _mhz(path: str) -> float | None:
    khz = _read(path)
    return round(int(khz) / 1000.0, 1) if khz and khz.isdigit() else None


def cpu_limit() -> tuple[float, str] | None:
    """The tightest CFS quota over this process: (cores, the cgroup directory that sets it), or None when no
    cgroup along its path has one or none is readable. The cgroup is the one /proc/self/cgroup names, walked
    up to its hierarchy's root (a quota on a parent caps its children): cgroup v1 `cpu.cfs_quota_us` /
    `cpu.cfs_period_us`, v2 `cpu.max`. Its `cpu.stat` counts the host's throttling (`remote.host.cpuwait`)."""
    try:
        limits = list(_quotas())
    except (OSError, ValueError):  # an unusual cgroup layout: say nothing rather than something wrong
        return None
    return min(limits) if limits else None


def _quotas() -> Iterator[tuple[float, str]]:
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            roots, v2 = [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")], True
        elif "cpu" in controllers.split(","):
            roots, v2 = [Path("/sys/fs/cgroup") / controllers, Path("/sys/fs/cgroup/cpu")], False
        else:
            continue
        for root in roots:
            node = root / path.lstrip("/")
            while node.is_relative_to(root):
                if v2 and (raw := _read(str(node / "cpu.max"))) and not raw.startswith("max"):
                    quota, period = raw.split()
                    yield round(int(quota) / int(period), 3), str(node)
                elif not v2 and (raw := _read(str(node / "cpu.cfs_quota_us"))) and raw != "-1":
                    yield round(int(raw) / int(_read(str(node / "cpu.cfs_period_us")) or 100000), 3), str(node)
                if node == root:
                    break
                node = node.parent


def _cpu_quota() -> float | None:
    """Cores this process may use under its cgroups' CFS quotas (the tightest); None: no quota."""
    limit = cpu_limit()
    return limit[0] if limit else None


def _online() -> list[int]:
    """The CPUs online (/proc/stat's cpuN lines)."""
    return [int(line[3:].split()[0]) for line in (_read("/proc/stat") or "").splitlines()
            if line[:3] == "cpu" and line[3:4].isdigit()]


def cpu_list(cores: set[int] | list[int]) -> str:
    """Cores as a cpuset list: {0, 1, 2, 3, 6} -> "0-3,6" (as taskset and hosts.toml's `cpus` write them)."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def pinned() -> str | None:
    """The cores this process is pinned to (its affinity), when that is not every CPU online: a host with
    `cpus`, or one run under taskset; None when it may run on any."""
    mine = os.sched_getaffinity(0)
    return None if mine >= set(_online()) else cpu_list(mine)


def host_state(sample_s: float = 0.2, windows: int = 4) -> dict:
    """This host as a serial run would find it. `busy_cores` and `runnable` are the other work on it over
    `sample_s` (this probe sleeps meanwhile): CPU time others used on the CPUs this host may use (its
    `cpus` when it is pinned, else all), in cores, and the machine's runnable threads. A CPU quota's
    throttling is no CPU time: it is never counted as busy (`cpu_quota` says what the host may use).

    The span is cut into `windows` and `busy_cores` is the least busy one: work that goes on (another
    team's run, a busy loop) is in every window, while a process that starts or exits in the middle (a
    shell, an import) is not what a baseline is measured against (`busy_peak_cores`: the busiest one)."""
    online, mine = _online(), os.sched_getaffinity(0)
    runnable: list[int] = []
    busy_per_window: list[float] = []
    for _ in range(windows if sample_s > 0 else 0):
        before, started = _cpu_line(mine), time.monotonic()
        while time.monotonic() - started < sample_s / windows:
            if (n := _procs_running()) is not None:
                runnable.append(n - 1)  # this probe was running when it read the count
            time.sleep(sample_s / windows / 4)
        after = _cpu_line(mine)
        if before and after and after[1] > before[1]:
            busy_per_window.append((after[0] - before[0]) / (after[1] - before[1]) * len(mine))
    busy = round(min(busy_per_window), 2) if busy_per_window else None
    load = (_read("/proc/loadavg") or "").split()
    cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq/"
    return {
        "time": time.time(), "cpus": len(mine), "cpus_online": len(online) or os.cpu_count(), "cpu_list": pinned(),
        "cpu_quota": _cpu_quota(), "busy_cores": busy,
        "busy_peak_cores": round(max(busy_per_window), 2) if busy_per_window else None,
        "runnable": round(sum(runnable) / len(runnable), 2) if runnable else None,
        "load1": float(load[0]) if load else None, "load5": float(load[1]) if len(load) > 1 else None,
        "governor": _read(cpufreq + "scaling_governor"), "freq_mhz": _mhz(cpufreq + "scaling_cur_freq"),
        "max_freq_mhz": _mhz(cpufreq + "scaling_max_freq"), "temperature_c": _temperature_c(),
        "throttled": _throttled(), "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "mem_available_mb": _mem_available_mb(),
    }


HASH_CACHE_LIMIT = 4 << 20
"""The most of the checkpoint hash cache that is read: more is not one pictl wrote (it is measured again)."""


MODEL_DIR_FILES = ("config.json", "model.safetensors")
"""What a Hugging Face model directory's digest covers: its architecture and its weights (`hf:DIR` models)."""


def checkpoint_digest(path: str, base_dir: str | None, cache_file: str | None) -> dict:
    """sha256 of a checkpoint file, remembered in `cache_file` by resolved path, size and mtime. A model
    directory's is that of its config and weights together (a file it lacks counts as absent)."""
    target = Path(os.path.expanduser(base_dir or ".")) / os.path.expanduser(path)
    try:
        target = target.resolve()
        st = target.stat()
    except OSError as exc:
        return {"path": str(target), "error": exc.strerror or str(exc)}
    if target.is_dir():
        parts = {name: checkpoint_digest(str(target / name), None, cache_file) for name in MODEL_DIR_FILES}
        together = json.dumps({name: part.get("sha256") or part.get("error") for name, part in parts.items()},
                              sort_keys=True)
        return {"path": str(target), "size": sum(p.get("size", 0) for p in parts.values()),
                "sha256": hashlib.sha256(together.encode()).hexdigest(),
                "cached": all(p.get("cached", False) for p in parts.values())}
    stamp = [st.st_size, st.st_mtime_ns]
    cache_path = Path(os.path.expanduser(cache_file)) if cache_file else None
    try:  # a cache of paths and digests is kilobytes: a larger file, or one behind a link, is not read
        cache: object = {}
        if cache_path:
            with open(cache_path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as fh:
                raw = fh.read(HASH_CACHE_LIMIT + 1)
            cache = json.loads(raw) if len(raw) <= HASH_CACHE_LIMIT else {}
    except (OSError, ValueError, RecursionError):
        cache = {}
    known = cache.get(str(target)) if isinstance(cache, dict) else None
    if isinstance(known, list) and known[:2] == stamp:
        return {"path": str(target), "size": st.st_size, "sha256": known[2], "cached": True}
    digest = hashlib.sha256()
    try:
        with target.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        return {"path": str(target), "error": exc.strerror or str(exc)}
    if cache_path:
        cache = cache if isinstance(cache, dict) else {}
        cache[str(target)] = [*stamp, digest.hexdigest()]
        try:  # best effort: a host we cannot write to only loses the shortcut
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}")
            tmp.unlink(missing_ok=True)  # (one a crash left; a link by that name goes as a link)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # never through a link
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(cache))
            os.replace(tmp, cache_path)
        except OSError:
            pass
    return {"path": str(target), "size": st.st_size, "sha256": digest.hexdigest(), "cached": False}


def state(args: argparse.Namespace) -> dict:
    return {"state": host_state(args.sample_s), "venv": _venv(args.venv),
            "checkpoint": checkpoint_digest(args.checkpoint, args.base_dir, args.hash_cache)
            if args.checkpoint else None}


def clock() -> None:
    """NTP's server half: for each line that arrives, this host's clock on receipt and on reply (ns)."""
    os.write(1, b"ready\n")
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 60.0)
        if not ready:
            return  # never outlive a forgotten measurement
        data = os.read(0, 4096)
        received = time.time_ns()
        if not data:
            return
        pending += data
        while b"\n" in pending:
            _, pending = pending.split(b"\n", 1)
            os.write(1, f"{received} {time.time_ns()}\n".encode())


def listen() -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        s.listen(64)
        print(s.getsockname()[1], flush=True)
        deadline = time.monotonic() + 120  # never outlive a forgotten check
        while time.monotonic() < deadline:
            ready, _, _ = select.select([s, sys.stdin], [], [], 1.0)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                return  # the controller is done (or gone)
            if s in ready:
                s.accept()[0].close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--venv", required=True)
    rep.add_argument("--interface")
    rep.add_argument("--connect")
    st = sub.add_parser("state")
    st.add_argument("--venv", required=True)
    st.add_argument("--sample-s", type=float, default=0.2)
    st.add_argument("--checkpoint")
    st.add_argument("--base-dir", help="what a relative checkpoint path is relative to (the run directory)")
    st.add_argument("--hash-cache", help="JSON file remembering checkpoint hashes by path, size and mtime")
    sub.add_parser("listen")
    sub.add_parser("clock")
    args = parser.parse_args(argv)
    if args.mode == "listen":
        listen()
    elif args.mode == "clock":
        clock()
    elif args.mode == "state":
        print(json.dumps(state(args)))
    else:
        print(json.dumps(report(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
