"""Keep a launched command tied to the controller that launched it (stdlib only).

    python -m remote.host.supervise --pgid-file FILE -- COMMAND...

Starts COMMAND in a process group of its own and records that group's id in
FILE (so `pictl stop` can find it later). The group is stopped (SIGTERM, then
SIGKILL after a grace period) when any of these happens:

- our stdin reaches end of file: the controller closed the pipe or the SSH
  channel, or died, or the connection dropped;
- we receive SIGTERM, SIGINT or SIGHUP;
- we die ourselves: the child is started with PR_SET_PDEATHSIG, so even a
  SIGKILLed supervisor takes its child down with it.

COMMAND's output passes straight through; our exit status is COMMAND's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading

GRACE_S = 5.0


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


class Supervisor:
    def __init__(self, argv: list[str], pgid_file: str) -> None:
        self.pgid_file = pgid_file
        self.child = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent,
                                      stdin=subprocess.DEVNULL)
        self._stopping = threading.Lock()
        self._exited = threading.Event()
        tmp = f"{pgid_file}.tmp"
        try:
            os.unlink(tmp)  # one a crash left (a link by that name goes as a link: its target is not touched)
        except FileNotFoundError:
            pass
        # O_EXCL: a name made meanwhile, a link included, is refused rather than written through.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{self.child.pid}\n")
        os.replace(tmp, pgid_file)

    def stop(self, *_: object) -> None:
        """Stop the whole group once, politely first: SIGTERM now, SIGKILL if the child outlives the grace."""
        if not self._stopping.acquire(blocking=False):
            return
        if _signal_group(self.child.pid, signal.SIGTERM):
            # The wait for the grace runs beside `run`, never in here: this is called as a signal handler on the
            # thread that sits in `child.wait()`, which holds the Popen's waitpid lock, so `child.poll()` from
            # here (or from the stdin thread) answers None until that wait returns: every stop used to last the
            # whole grace period, however fast the child went.
            threading.Thread(target=self._kill_after_grace, daemon=True).start()

    def _kill_after_grace(self) -> None:
        if not self._exited.wait(GRACE_S):
            _signal_group(self.child.pid, signal.SIGKILL)

    def watch_stdin(self) -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader
        # aborts the interpreter at shutdown.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        self.stop()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.stop)
        threading.Thread(target=self.watch_stdin, daemon=True).start()
        rc = self.child.wait()
        self._exited.set()
        _signal_group(self.child.pid, signal.SIGKILL)  # whatever the leader left in its group
        try:
            os.unlink(self.pgid_file)
        except FileNotFoundError:
            pass
        return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pgid-file", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    return Supervisor(command, args.pgid_file).run()


if __name__ == "__main__":
    sys.exit(main())
