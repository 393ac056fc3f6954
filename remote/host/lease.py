"""Hold a run's lease on this host's workdir for as long as the controller is attached (stdlib only).

    python -c BOOT hold --workdir DIR --record JSON [--python PATH]     (this file's text: stdin's first line)

Sent, not pushed: the lease is taken before any code is pushed, so a second run never
rewrites the code a first one is using. The command line carries only a one-line loader
(`pictl.cluster.leases.BOOT`) that reads this file's text, as one JSON string, from the
first line of stdin: `ps` shows a short line, not the whole script. Prints one JSON line:

- {"state": "held", "lease": {...}}: the lease is ours until our stdin closes (the
  controller released it, went away, or lost its connection) or we are signalled;
- {"state": "busy", "lease": {...}}: another run holds it (exit 3);
- {"state": "not_ready", "error": "..."}: the workdir cannot be made, the lease file or
  one of the directories pictl makes in it (`OWNED`) is a symbolic link (never followed:
  it would lead pictl's writes and removals out of the workdir), or there is no
  interpreter at PATH (exit 2).

The lease is `DIR/lease`, locked with flock(LOCK_EX | LOCK_NB) and holding the
holder's record as JSON: what the controller sends (run id, user, controller host,
owner), plus this host's login, the start time and our pid.
Taking it is atomic (the kernel grants one exclusive lock), and it is never stale:
the kernel drops the lock when the holder is gone, however it went (even SIGKILL),
so a record left in a file nobody locks means "free". The file itself stays (an
unlinked file could be locked by two runs at once); releasing empties it.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import getpass
import json
import os
import shutil
import signal
import stat
import sys
import time

LEASE_FILE = "lease"
OWNED = ("runs", "code", "models", "cache", "provision")
"""What pictl makes in a workdir (run directories, the pushed code, artifacts, caches, wheels): taken only when
none of them is a link."""
EXIT_BUSY = 3
EXIT_NOT_READY = 2


def _say(state: dict) -> None:
    sys.stdout.write(json.dumps(state) + "\n")
    sys.stdout.flush()


def _holder(fd: int) -> dict:
    """The record in a lease someone else holds (it may be mid-write: read it again for a moment)."""
    for _ in range(20):
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        try:
            record = json.loads(raw.decode())
            if isinstance(record, dict):
                return record
        except ValueError:
            pass
        time.sleep(0.05)
    return {}


class _Link(Exception):
    pass


def _open_lease(workdir: str) -> int:
    """The lease file, opened from the workdir's descriptor; _Link naming the first of the workdir's own
    entries that is a symbolic link (the workdir itself is the inventory's: taken as it is)."""
    os.makedirs(workdir, exist_ok=True)
    dir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in (LEASE_FILE, *OWNED):
            try:
                if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                    raise _Link(os.path.join(workdir, name))
            except FileNotFoundError:
                pass
        try:  # O_NOFOLLOW: a link made since the look above is refused all the same
            return os.open(LEASE_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Link(os.path.join(workdir, LEASE_FILE)) from None
            raise
    finally:
        os.close(dir_fd)


def hold(workdir: str, record: dict, python: str | None) -> int:
    workdir = os.path.expanduser(workdir)
    try:
        fd = _open_lease(workdir)
    except _Link as link:
        _say({"state": "not_ready", "error": f"{link} is a symbolic link: pictl never follows links in its "
                                             "workdir (remove it)"})
        return EXIT_NOT_READY
    except OSError as exc:
        _say({"state": "not_ready", "error": f"cannot use the workdir {workdir}: {exc.strerror or exc}"})
        return EXIT_NOT_READY
    interpreter = os.path.expanduser(python) if python and "/" in python else shutil.which(python or "")
    if python and not (interpreter and os.access(interpreter, os.X_OK)):
        _say({"state": "not_ready", "error": f"no python at {python} (set `venv`, or run `pictl provision`)"})
        return EXIT_NOT_READY
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _say({"state": "busy", "lease": _holder(fd)})
        return EXIT_BUSY
    record = {**record, "login": getpass.getuser(), "pid": os.getpid(), "started_at": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    os.fsync(fd)

    def release(*_: object) -> None:
        os.ftruncate(fd, 0)  # free for the next run (the kernel drops the lock when we exit)
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, release)
    _say({"state": "held", "lease": record})
    try:
        while os.read(0, 4096):  # the controller's pipe or SSH channel: EOF is the release
            pass
    except OSError:
        pass
    release()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    take = sub.add_parser("hold")
    take.add_argument("--workdir", required=True)
    take.add_argument("--record", required=True, help="JSON object: run_id, user, controller, owner")
    take.add_argument("--python")
    args = parser.parse_args(argv)
    record = json.loads(args.record)
    return hold(args.workdir, record if isinstance(record, dict) else {}, args.python)


if __name__ == "__main__":
    sys.exit(main())
