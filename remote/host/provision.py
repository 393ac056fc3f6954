"""Create the host's venv and install the pinned requirements (stdlib only; runs before any venv exists).

    python provision.py --venv PATH --requirements FILE --fingerprint HEX
                        [--wheels DIR | --extra-index-url URL] [--system-site-packages]
                        [--installer auto|uv|pip]

Prints one JSON object per line: {"step": ...} as it goes, then {"done": ...} or
{"error": ..., "tail": [the installer's last lines]}. Exit 0 ok, 2 the host cannot
hold the venv (python too old, path not writable), 3 the installer failed.

Installer choice: uv when the host has it or can get it (pip installs it into the
venv, from the wheelhouse when offline), else pip. A venv that reuses the host's
system packages always uses pip: uv does not count packages it finds through
`include-system-site-packages` as installed (astral-sh/uv#7358, #4466), so it
would fetch torch again, which on an offline Pi fails.
The fingerprint is written last, atomically: an interrupted install is never
reported "up to date".
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import time

FINGERPRINT_FILE = ".pictl-provisioned"
MIN_PYTHON = (3, 11)
TAIL_LINES = 15


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


class Failed(Exception):
    def __init__(self, message: str, code: int, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.tail = tail or []


def find_uv() -> list[str] | None:
    """uv on PATH, in the usual per-user install places, or as a module of this python."""
    for candidate in (shutil.which("uv"), os.path.expanduser("~/.local/bin/uv"), os.path.expanduser("~/.cargo/bin/uv")):
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    probe = subprocess.run([sys.executable, "-c", "import uv"], capture_output=True)
    return [sys.executable, "-m", "uv"] if probe.returncode == 0 else None


def check_writable(venv: str) -> None:
    """The venv, or the nearest directory that exists above it, must be writable by us."""
    path = venv
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.access(path, os.W_OK | os.X_OK):
        user = os.environ.get("USER") or str(os.getuid())
        raise Failed(f"venv path {venv} is not writable by user {user} ({path} is not)", 2)


def run_step(step: str, argv: list[str]) -> None:
    """Run one installer command, streaming its lines as progress and keeping the last ones."""
    emit(step=step, argv=argv)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1"})
    except OSError as exc:
        raise Failed(f"{step}: cannot start {argv[0]}: {exc}", 3) from exc
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail.append(line)
            emit(step=step, line=line[-200:])
    if proc.wait() != 0:
        raise Failed(f"{step} failed (exit {proc.returncode})", 3, list(tail))


def unshadow_seed_packages(python: str, venv: str) -> None:
    """Python 3.11's venv seeds an old setuptools, which would hide the host's own (torch needs >= 77)."""
    seeded = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "setuptools-*.dist-info"))
    if seeded:
        run_step("venv", [python, "-m", "pip", "uninstall", "-y", "-q", "setuptools"])


def bootstrap_uv(python: str, index: list[str]) -> list[str] | None:
    """A host without uv can get it: pip puts it in the venv (from the wheelhouse offline)."""
    emit(step="uv", argv=[python, "-m", "pip", "install", "uv"])
    result = subprocess.run([python, "-m", "pip", "install", "-q", *index, "uv"], capture_output=True, text=True)
    uv = os.path.join(os.path.dirname(python), "uv")
    if result.returncode == 0 and os.access(uv, os.X_OK):
        return [uv]
    emit(step="uv", line="uv not available here: installing with pip")
    return None


def provision(args: argparse.Namespace) -> str:
    if sys.version_info[:2] < MIN_PYTHON:
        raise Failed(f"python {sys.executable} is {sys.version.split()[0]}; pictl needs >= 3.11", 2)
    venv = os.path.abspath(os.path.expanduser(args.venv))
    check_writable(venv)
    uv = None if args.installer == "pip" or args.system_site_packages else find_uv()
    if args.installer == "uv" and uv is None:
        raise Failed("--installer uv, but this host has no uv", 2)
    site = ["--system-site-packages"] if args.system_site_packages else []
    index = ["--no-index", "--find-links", os.path.expanduser(args.wheels)] if args.wheels else []
    if args.extra_index_url:
        index += ["--extra-index-url", args.extra_index_url]
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, FINGERPRINT_FILE)
    if os.path.exists(stamp):
        os.remove(stamp)  # from here on the venv is not known to be complete
    if uv:
        run_step("venv", [*uv, "venv", "--allow-existing", "--python", sys.executable, *site, venv])
    else:
        run_step("venv", [sys.executable, "-m", "venv", *site, venv])
        if args.system_site_packages:
            unshadow_seed_packages(python, venv)
        elif args.installer == "auto":
            uv = bootstrap_uv(python, index)
    if uv:
        # uv writes no bytecode unless asked (pip does): without it a host whose python may not write
        # __pycache__ compiles torch and timm from source in every process it starts.
        run_step("install", [*uv, "pip", "install", "--compile-bytecode", "--python", python, *index, "-r",
                             args.requirements])
    else:
        run_step("install", [python, "-m", "pip", "install", *index, "-r", args.requirements])
    tmp = f"{stamp}.tmp"
    with open(tmp, "w") as fh:
        fh.write(args.fingerprint)
    os.replace(tmp, stamp)
    return "uv" if uv else "pip"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", required=True)
    parser.add_argument("--requirements", required=True)
    parser.add_argument("--fingerprint", required=True)
    parser.add_argument("--wheels")
    parser.add_argument("--extra-index-url")
    parser.add_argument("--system-site-packages", action="store_true")
    parser.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    args = parser.parse_args(argv)
    args.requirements = os.path.expanduser(args.requirements)
    start = time.monotonic()
    try:
        installer = provision(args)
    except Failed as exc:
        emit(error=str(exc), tail=exc.tail)
        return exc.code
    emit(done=True, installer=installer, seconds=round(time.monotonic() - start, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
