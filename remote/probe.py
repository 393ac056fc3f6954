"""What `pictl check` learns about a host (stdlib only; runs before any venv exists).

    python probe.py report --venv PATH [--interface IF] [--connect ADDR:PORT]
    python probe.py listen     # prints a free port, accepts connections until stdin closes

Prints one JSON object. Nothing here imports torch: package versions are read
from the venv's metadata, which takes milliseconds.
"""

from __future__ import annotations

import argparse
import fcntl
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
from pathlib import Path

PACKAGES = ("torch", "torchvision", "timm")


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
        return {"exists": True, **json.loads(out.stdout)}
    except (subprocess.SubprocessError, ValueError, OSError) as exc:
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
        "machine": platform.machine(), "cpus": os.cpu_count(), "mem_available_mb": _mem_available_mb(),
        "temperature_c": _temperature_c(), "throttled": _throttled(), "venv": _venv(args.venv),
        "interface": _interface(args.interface), "rendezvous": _reach(args.connect),
    }


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
    sub.add_parser("listen")
    args = parser.parse_args(argv)
    if args.mode == "listen":
        listen()
    else:
        print(json.dumps(report(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
