"""Stop process groups a pictl run left behind on this host (stdlib only).

    python -m remote.cleanup --workdir DIR [--orphans-only]

Reads the group ids `remote.supervise` recorded under DIR/runs/*/pgid-*, checks
that each group still belongs to a pictl launch (its leader works inside
DIR/runs: a recycled id is left alone), stops it (SIGTERM, then SIGKILL)
and removes the record. With --orphans-only, groups whose supervisor is still
alive (a controller is still attached) are kept. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

GRACE_S = 5.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but not ours: never touched below


def is_pictl_leader(pid: int, runs: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(runs.resolve())
    except OSError:
        return False


def stop_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def cleanup(workdir: Path, *, orphans_only: bool) -> dict:
    stopped, kept, stale = [], [], 0
    for record in sorted(workdir.glob("runs/*/pgid-*")):
        try:
            pgid = int(record.read_text().strip())
        except (OSError, ValueError):
            continue
        if not _group_alive(pgid) or not is_pictl_leader(pgid, workdir / "runs"):
            stale += 1
            record.unlink(missing_ok=True)
            continue
        if orphans_only and "remote.supervise" in _cmdline(_parent(pgid)):
            kept.append({"run": record.parent.name, "pgid": pgid})
            continue
        try:
            stop_group(pgid)
        except PermissionError:
            kept.append({"run": record.parent.name, "pgid": pgid, "reason": "not ours"})
            continue
        stopped.append({"run": record.parent.name, "pgid": pgid})
        record.unlink(missing_ok=True)
    return {"stopped": stopped, "kept": kept, "stale": stale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--orphans-only", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(cleanup(Path(os.path.expanduser(args.workdir)), orphans_only=args.orphans_only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
