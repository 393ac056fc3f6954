"""`pictl` as a process of its own without paying its import each time: a server imports `pictl.cli` once, then
forks a child per command that runs `python -m pictl ARGS` (or `python -c CODE`) with the command's own
arguments, environment, working directory and stdin/stdout/stderr, and exits with its code. Each command is
still a process of its own (its exit status, its streams, nothing shared with the test); only the
interpreter's start and the import are not repeated. For modules of many short commands (bad input refused
in one line): a fresh `python -m pictl` spends most of its second importing.

What an interpreter reads only as it starts (`PYTHON*`, the locale, colour and width settings some libraries
read at import) is the server's: a command whose environment differs from the server's in more than pictl's own
variables (`PICTL_*`, `XDG_STATE_HOME`, pytest's `PYTEST_CURRENT_TEST`) is refused here; run it with
`support.cli.run_pictl`."""

from __future__ import annotations

import io
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.cli import ROOT

_SERVER = r'''
import io, json, os, socket, sys
import pictl.cli  # noqa: F401  (what every `python -m pictl` imports first: paid once, here)
import pictl.headless  # noqa: F401  (and what most of its commands import next)


def serve(path):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(f"{path}.new")
    listener.listen()
    os.rename(f"{path}.new", path)  # (the name appears once it answers)
    while True:
        conn, _ = listener.accept()
        data, fds, _, _ = socket.recv_fds(conn, 8, 3)  # the body's size, and the command's three streams
        while len(data) < 8 and (more := conn.recv(8 - len(data))):
            data += more
        size, body = int.from_bytes(data, "big"), b""
        while len(body) < size and (more := conn.recv(1 << 16)):
            body += more
        if len(fds) != 3 or len(body) < size:  # a test that gave up while it asked
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            return json.loads(body), fds
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(f"{pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:  # the test gave up on it (a timeout): it was killed, nothing to report
            pass
        finally:
            conn.close()


def stdio(fd, like):
    """The stream an interpreter starting on `fd` makes (as CPython's create_stdio does on POSIX)."""
    raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
    buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors, newline="\n",
                            line_buffering=fd == 2 or (fd == 1 and raw.isatty()))


for name in sys.argv[2:]:  # what this module's commands import besides
    __import__(name)
request, fds = serve(sys.argv[1])
for target, fd in enumerate(fds):  # the command's stdin, stdout and stderr
    os.dup2(fd, target)
    os.close(fd)
sys.stdin = sys.__stdin__ = stdio(0, sys.stdin)
sys.stdout = sys.__stdout__ = stdio(1, sys.stdout)
sys.stderr = sys.__stderr__ = stdio(2, sys.stderr)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.argv = request["argv"]
if request["code"] is not None:  # as `python -c CODE`
    sys.path[0] = ""
    exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
else:  # as `python -m pictl` started in cwd
    import runpy

    sys.path[0] = request["cwd"]
    runpy.run_module("pictl", run_name="__main__", alter_sys=True)
'''

_OURS = ("PICTL_",)
_OURS_EXACTLY = ("XDG_STATE_HOME", "PYTEST_CURRENT_TEST")


def _differ(server: dict[str, str], command: dict[str, str], ours: tuple[str, ...] = _OURS) -> list[str]:
    """The variables `command` sets otherwise than `server`, besides those only pictl reads (`ours`)."""
    differ = {k for k in server.keys() | command.keys() if server.get(k) != command.get(k)}
    return sorted(k for k in differ if not k.startswith(ours) and k not in _OURS_EXACTLY)


def same_interpreter(server: dict[str, str], command: dict[str, str]) -> bool:
    """Whether a command in `command`'s environment may be forked from a server started in `server`'s."""
    return not _differ(server, command)


class PictlServer:
    """A server of `pictl` processes (see the module); `close()` ends it. `env` is what every command's
    environment is compared with, and what the server started under; `preload` names modules the commands
    import (pictl imports the heaviest, matplotlib, only where it draws); `command_env` names more variables
    (prefixes) a command may set of its own, read only by what the server has not imported."""

    def __init__(self, folder: Path, env: dict[str, str], preload: tuple[str, ...] = (),
                 command_env: tuple[str, ...] = ()) -> None:
        self.env = dict(env)
        self.ours = (*_OURS, *command_env)
        self.socket = str(folder / "pictl.sock")
        self._log = open(folder / "server.log", "w")  # noqa: SIM115  (closed with the server)
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, self.socket, *preload], env=self.env, cwd=ROOT,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.socket):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the pictl server did not start: {(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def with_settings(self, test_env: dict[str, str]) -> dict[str, str]:
        """The test's pictl settings (`PICTL_*`) in the environment this server started with: what the test's own
        process sets as it goes (importing timm there sets TORCHINDUCTOR_CACHE_DIR) is not its commands'."""
        return {**self.env, **{k: v for k, v in test_env.items() if k.startswith(_OURS)}}

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._log.close()

    def run(self, args: list[str], env: dict[str, str], timeout: float = 120, *, cwd: Path = ROOT,
            input: str | None = None, errors: str | None = None,
            code: str | None = None) -> subprocess.CompletedProcess[str]:
        """As `support.cli.run_pictl(args, env, timeout, cwd=cwd, input=input, errors=errors)`; with `code`, as
        `python -c CODE` (`args` its argv after `-c`)."""
        theirs = _differ(self.env, env, self.ours)
        if theirs:
            raise ValueError(f"{theirs}: read as an interpreter starts; use support.cli.run_pictl")
        argv = ["-c", *args] if code is not None else ["-m", *args]  # (argv[0]: runpy's, as with -m)
        body = json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "code": code}).encode()
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(self.socket)
            socket.send_fds(conn, [len(body).to_bytes(8, "big")], [stdin_r, out_w, err_w])
            conn.sendall(body)
        finally:
            for fd in (stdin_r, out_w, err_w):
                os.close(fd)
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        readers = [threading.Thread(target=_drain, args=(fd, chunks[fd]), daemon=True) for fd in (out_r, err_r)]
        data = (input or "").encode(locale.getpreferredencoding(False))
        writer = threading.Thread(target=_feed, args=(stdin_w, data), daemon=True)
        for t in (*readers, writer):
            t.start()
        deadline = time.monotonic() + timeout
        reply = conn.makefile("r")
        pid = 0
        try:
            conn.settimeout(timeout)
            pid = int(reply.readline())
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            line = reply.readline()
            if not line:
                raise RuntimeError(f"the pictl server ended: {Path(self.socket).with_name('server.log').read_text()}")
            returncode = int(line)
            for t in readers:
                t.join(max(0.1, deadline - time.monotonic()))
            if any(t.is_alive() for t in readers):  # a process it left holds its stdout or stderr
                raise TimeoutError
        except TimeoutError:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise subprocess.TimeoutExpired(["pictl", *args], timeout) from None
        finally:
            reply.close()
            conn.close()
            writer.join(1)
            for t in readers:
                t.join(1)
            for fd in (out_r, err_r):
                os.close(fd)
        out, err = (_text(b"".join(chunks[fd]), errors) for fd in (out_r, err_r))
        return subprocess.CompletedProcess(["python", *argv], returncode, out, err)


def _drain(fd: int, into: list[bytes]) -> None:
    while chunk := os.read(fd, 65536):
        into.append(chunk)


def _feed(fd: int, data: bytes) -> None:
    try:
        if data:
            os.write(fd, data)
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _text(data: bytes, errors: str | None) -> str:
    """As `subprocess.run(text=True)` reads a stream: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=None, errors=errors).read()
