"""Stop process groups a pictl run left behind on this host, and remove finished run directories (stdlib only).

    python -m remote.host.cleanup --workdir DIR [--orphans-only [--keep RUN]] [--owner NAME] [--finish RUN]

Reads the group ids `remote.host.supervise` (and the warm process, for the jobs it forks) recorded under
DIR/runs/*/pgid-*. A group
is only ever touched when it is provably ours: it belongs to this login, and its
leader works inside DIR/runs (a recycled id is left alone). A group that cannot be
inspected (another user's: /proc/<pid>/cwd gives EACCES) is not ours and is kept,
record and all; a permission error on one record never stops the sweep of the
others. Ours are stopped (SIGTERM, then SIGKILL) and their records removed.

- `--orphans-only` (every run does this first): groups whose supervisor is still
  alive (a controller is attached) are kept; run directories other than `--keep`
  with no live group left and untouched for STALE_DIR_S are removed (what crashed
  runs left: a run removes its own at its end; the age spares a directory some
  lease-less job, such as a sweep's planning, is filling right now).
- `--owner NAME` (`pictl stop`): live runs whose owner file names another
  controller are kept as "another controller's"; ours, and orphans whoever left
  them (nobody drives them: every run's sweep stops them too), are stopped.
  Without it: every run.
- `--finish RUN` (a run's end): remove that run's directory if none of its
  groups is alive.

Prints one JSON line: {"stopped": [...], "kept": [...], "stale": n, "removed": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from remote.protocol import OWNER_FILE

GRACE_S = 5.0
STALE_DIR_S = 3600.0


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


def _owner_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def leader_state(pid: int, runs: Path) -> str:
    """"ours" (our login, working inside `runs`), "foreign" (cannot be inspected, or another user's,
    or working elsewhere: a recycled id) or "gone"."""
    uid = _owner_uid(pid)
    if uid is None:
        return "gone"
    if uid != os.getuid():
        return "foreign"
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "foreign"  # EACCES: not ours to judge, so never ours to stop
    return "ours" if cwd.is_relative_to(runs.resolve()) else "foreign"


def is_pictl_leader(pid: int, runs: Path) -> bool:
    return leader_state(pid, runs) == "ours"


def stop_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def _owner_of(run_dir: Path) -> str | None:
    try:
        return (run_dir / OWNER_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _sweep_one(record: Path, runs: Path, *, orphans_only: bool, owner: str | None, out: dict) -> None:
    run = record.parent.name
    try:
        pgid = int(record.read_text().strip())
    except (OSError, ValueError):
        out["kept"].append({"run": run, "record": record.name, "reason": "unreadable record"})
        return
    state = leader_state(pgid, runs) if _group_alive(pgid) else "gone"
    if state == "gone":
        out["stale"] += 1
        try:
            record.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove (another user's directory): harmless
        return
    if state == "foreign":
        out["kept"].append({"run": run, "pgid": pgid, "reason": "not ours"})
        return
    # A controller still drives it: through its supervisor, or through the warm process that forked it (which
    # stops it when the job's client goes away).
    parent = _cmdline(_parent(pgid))
    attached = "remote.host.supervise" in parent or "remote.host.warm" in parent
    if orphans_only and attached:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "live run"})
        return
    if owner is not None and attached and _owner_of(record.parent) != owner:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "another controller's run"})
        return
    try:
        stop_group(pgid)
    except PermissionError:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "not ours"})
        return
    except ProcessLookupError:
        pass
    out["stopped"].append({"run": run, "pgid": pgid})
    try:
        record.unlink(missing_ok=True)
    except OSError:
        pass


def _live_groups(run_dir: Path) -> bool:
    for record in run_dir.glob("pgid-*"):
        try:
            if _group_alive(int(record.read_text().strip())):
                return True
        except (OSError, ValueError):
            return True  # cannot tell: keep the directory
    return False


def _remove_run_dir(run_dir: Path, out: dict, min_age_s: float = 0.0) -> None:
    try:
        st = run_dir.lstat()
        if run_dir.is_dir() and not run_dir.is_symlink() and st.st_uid == os.getuid() \
                and time.time() - st.st_mtime >= min_age_s and not _live_groups(run_dir):
            shutil.rmtree(run_dir)
            out["removed"].append(run_dir.name)
    except OSError:
        pass  # best effort: a directory we cannot remove is left as it is


def cleanup(workdir: Path, *, orphans_only: bool, owner: str | None = None, keep: str | None = None,
            finish: str | None = None) -> dict:
    runs = workdir / "runs"
    out: dict = {"stopped": [], "kept": [], "stale": 0, "removed": []}
    if finish:
        _remove_run_dir(runs / finish, out)
        return out
    try:
        records = sorted(runs.glob("*/pgid-*"))
    except OSError:
        records = []
    for record in records:
        try:
            _sweep_one(record, runs, orphans_only=orphans_only, owner=owner, out=out)
        except OSError as exc:  # whatever one record does, the others are still swept
            out["kept"].append({"run": record.parent.name, "record": record.name, "reason": str(exc)})
    if orphans_only and keep:
        for run_dir in sorted(runs.glob("*/")):
            if run_dir.name != keep:
                _remove_run_dir(run_dir, out, min_age_s=STALE_DIR_S)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--orphans-only", action="store_true")
    parser.add_argument("--owner")
    parser.add_argument("--keep")
    parser.add_argument("--finish")
    args = parser.parse_args(argv)
    for name in (args.keep, args.finish):
        if name is not None and (not name or "/" in name or name in (".", "..")):
            parser.error(f"not a run id: {name!r}")
    print(json.dumps(cleanup(Path(os.path.expanduser(args.workdir)), orphans_only=args.orphans_only,
                             owner=args.owner, keep=args.keep, finish=args.finish)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
