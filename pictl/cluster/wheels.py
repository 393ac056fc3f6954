"""`pictl wheels`: the pinned requirements as wheels for the hosts' platform, for offline provisioning.

pip can resolve for another platform (`--platform`, `--python-version`,
`--only-binary=:all:`), so a controller on x86-64 with internet gathers the wheels
a Pi without internet installs (`pictl provision --wheels DIR`, no index).

PyPI's torch 2.14.1 for aarch64 is a CUDA build: with its CUDA packages the set is
47 wheels, 3.2 GB (measured). A CPU-only index given as --extra-index-url (the
PyTorch project publishes one) offers `2.14.1+cpu`, which pip prefers, since a
local version sorts after the plain one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pictl import errors as E
from pictl.cluster.provision import remote_requirements

ARCHES = ("aarch64", "armv7l", "x86_64")


def platform_tags(arch: str) -> list[str]:
    """Every manylinux tag a glibc 2.17..2.36 host accepts (Raspberry Pi OS Bookworm has 2.36)."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(36, 16, -1)] + [f"manylinux2014_{arch}",
                                                                            f"linux_{arch}"]


def pip_download_argv(dest: Path, requirements: list[str], *, platform: str, python_version: str,
                      extra_index_url: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", python_version, "--dest", str(dest)]
    if extra_index_url:
        argv += ["--extra-index-url", extra_index_url]
    for tag in platform_tags(platform):
        argv += ["--platform", tag]
    return [*argv, *requirements]


def gather_wheels(dest: Path, *, platform: str, python_version: str,
                  extra_index_url: str | None = None) -> list[Path]:
    if platform not in ARCHES:
        raise E.ConfigError(f"--platform: '{platform}' is not one of {', '.join(ARCHES)}")
    if not python_version.replace(".", "").isdigit() or python_version.count(".") != 1:
        raise E.ConfigError(f"--python-version: '{python_version}' is not like 3.11")
    dest.mkdir(parents=True, exist_ok=True)
    # uv (the resolver uv adds to the hosts) rides along: provisioning from these wheels can use it.
    argv = pip_download_argv(dest, [*remote_requirements(), "uv"], platform=platform,
                             python_version=python_version, extra_index_url=extra_index_url)
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise E.PictlError(f"pip download failed for {platform}/cp{python_version}:\n{tail}")
    return sorted(dest.glob("*.whl"))
