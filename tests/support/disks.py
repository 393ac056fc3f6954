"""A full disk for tests: a small tmpfs mounted for the test (root only; skipped loudly elsewhere, never in CI)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.clusters import skip_loudly


@contextmanager
def small_tmpfs(where: Path, size: str = "256k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (made) for the block, unmounted after it."""
    if os.geteuid() != 0:
        skip_loudly("NEEDS ROOT: a full filesystem is a tmpfs mounted for the test")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        skip_loudly(f"CANNOT MOUNT A TMPFS: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Fill `disk` to its last block (a file `filler`): the next write there fails with ENOSPC."""
    with (disk / "filler").open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
