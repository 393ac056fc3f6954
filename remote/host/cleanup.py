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

Nothing is reached through a symbolic link: DIR/runs being one is refused whole (one JSON line
{"error": "..."} naming it, exit 2, nothing stopped or removed); a run directory, a record or an
owner file that is one is never followed, read or removed (run directories are opened and removed
through directory descriptors, `remote.floor.nofollow`).

Prints one JSON line: {"stopped": [...], "kept": [...], "stale": n, "removed": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

from remote.floor import entries, nofollow
from remote.floor.protocol import OWNER_FILE

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


RECORD_LIMIT = 4096
"""A pgid record is a number and an owner file a name: more than this is not ours, and is not read."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_small(dir_fd: int, name: str) -> str:
    """A small regular file in the directory `dir_fd`, never through a link (OSError otherwise)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name}: not a regular file")
        data = os.read(fd, RECORD_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > RECORD_LIMIT:
        raise OSError(f"{name}: larger than a record")
    return data.decode(errors="replace")


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass  # gone already, or not ours to remove (another user's directory): harmless


def _owner_of(run_fd: int) -> str | None:
    try:
        return _read_small(run_fd, OWNER_FILE).strip()
    except OSError:
        return None


def _records(run_fd: int) -> list[str]:
    """The pgid records in a run directory (regular files only: a link named like one is never read)."""
    with os.scandir(run_fd) as entries:
        return sorted(e.name for e in entries if e.name.startswith("pgid-") and e.is_file(follow_symlinks=False))


def _sweep_one(run_fd: int, run: str, name: str, runs: Path, *, orphans_only: bool, owner: str | None,
               out: dict) -> None:
    try:
        pgid = int(_read_small(run_fd, name).strip())
    except (OSError, ValueError):
        out["kept"].append({"run": run, "record": name, "reason": "unreadable record"})
        return
    state = leader_state(pgid, runs) if _group_alive(pgid) else "gone"
    if state == "gone":
        out["stale"] += 1
        _unlink(run_fd, name)
        return
    if state == "foreign":
        out["kept"].append({"run": run, "pgid": pgid, "reason": "not ours"})
        return
    # A controller still drives it: through its supervisor, or through the warm process that forked it (which
    # stops it when the job's client goes away).
    parent = _cmdline(_parent(pgid))
    # (its supervisor; a warm process, or the warm client that runs the job cold beside it)
    attached = any(e.module in parent for e in (entries.SUPERVISE, entries.WARM_ROOT, entries.WARM_CLIENT))
    if orphans_only and attached:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "live run"})
        return
    holder = _owner_of(run_fd)
    if owner is not None and attached and holder != owner:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "another controller's run", "owner": holder})
        return
    try:
        stop_group(pgid)
    except PermissionError:
        out["kept"].append({"run": run, "pgid": pgid, "reason": "not ours"})
        return
    except ProcessLookupError:
        pass
    out["stopped"].append({"run": run, "pgid": pgid, "owner": holder})
    _unlink(run_fd, name)


def _live_groups(run_fd: int) -> bool:
    for name in _records(run_fd):
        try:
            if _group_alive(int(_read_small(run_fd, name).strip())):
                return True
        except (OSError, ValueError):
            return True  # cannot tell: keep the directory
    return False


def _remove_run_dir(runs_fd: int, name: str, out: dict, min_age_s: float = 0.0) -> None:
    """Remove the run directory `name` (in the runs directory `runs_fd`): only a real directory of ours (a link
    is never followed, nor removed), untouched for `min_age_s`, with no live group; removed through the
    descriptors, so nothing outside it is reached."""
    try:
        st = os.lstat(name, dir_fd=runs_fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or time.time() - st.st_mtime < min_age_s:
            return
        run_fd = os.open(name, _DIR, dir_fd=runs_fd)
        try:
            live = _live_groups(run_fd)
        finally:
            os.close(run_fd)
        if not live:
            shutil.rmtree(name, dir_fd=runs_fd)
            out["removed"].append(name)
    except OSError:
        pass  # best effort: a directory we cannot remove is left as it is


def _run_dirs(runs_fd: int, out: dict) -> list[str]:
    """The run directories (a link among them is said and left alone)."""
    names = []
    with os.scandir(runs_fd) as entries:
        for e in entries:
            if e.is_symlink():
                out["kept"].append({"run": e.name, "reason": "a symbolic link: not followed"})
            elif e.is_dir(follow_symlinks=False):
                names.append(e.name)
    return sorted(names)


def cleanup(workdir: Path, *, orphans_only: bool, owner: str | None = None, keep: str | None = None,
            finish: str | None = None) -> dict:
    """What was stopped, kept and removed; LinkFound (nothing touched) if `workdir/runs` is a link."""
    runs = workdir / "runs"
    out: dict = {"stopped": [], "kept": [], "stale": 0, "removed": []}
    try:
        runs_fd = nofollow.open_dir(workdir, "runs")
    except nofollow.LinkFound:
        raise
    except OSError:
        return out  # no runs directory (yet): nothing to sweep
    try:
        if finish:
            _remove_run_dir(runs_fd, finish, out)
            return out
        try:
            run_names = _run_dirs(runs_fd, out)
        except OSError:
            run_names = []
        for run in run_names:
            try:
                run_fd = os.open(run, _DIR, dir_fd=runs_fd)
            except OSError:
                continue  # gone meanwhile, or another user's
            try:
                for name in _records(run_fd):
                    try:
                        _sweep_one(run_fd, run, name, runs, orphans_only=orphans_only, owner=owner, out=out)
                    except OSError as exc:  # whatever one record does, the others are still swept
                        out["kept"].append({"run": run, "record": name, "reason": str(exc)})
            except OSError as exc:
                out["kept"].append({"run": run, "reason": str(exc)})
            finally:
                os.close(run_fd)
        if orphans_only and keep:
            for run in run_names:
                if run != keep:
                    _remove_run_dir(runs_fd, run, out, min_age_s=STALE_DIR_S)
        return out
    finally:
        os.close(runs_fd)


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
    try:
        swept = cleanup(Path(os.path.expanduser(args.workdir)), orphans_only=args.orphans_only, owner=args.owner,
                        keep=args.keep, finish=args.finish)
    except nofollow.LinkFound as link:  # nothing was stopped or removed
        print(json.dumps({"error": f"{link}: remove it (pictl keeps its run directories there)"}))
        return 2
    print(json.dumps(swept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
