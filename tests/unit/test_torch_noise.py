"""torch's teardown noise after a good run goes to the run's log, not the terminal: recorded lines are written by
a real process on a local host and read through the real stream, then drawn by the real headless renderer."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

from rich.console import Console

from pictl.cluster.stream import ProcessStream
from pictl.cluster.torch_noise import TorchNoise, Verdict
from pictl.cluster.transport.local import LocalTransport
from pictl.events import HostOutput, SessionEvent
from pictl.headless import HeadlessRenderer
from pictl.inventory import Host

RECORDED = Path(__file__).parents[1] / "support" / "data" / "torch_noise" / "exit_barrier_after_a_good_run.log"
"""A host's stderr after a good 2-stage run on the local cluster (2026-11-26): its torchrun agent's store
warning, c10's stack dump and the exit-barrier traceback (glog-prefixed, as torch 2.x writes them)."""
AFTER = "RuntimeError: a line of the host's own, after the noise"


class Kept:
    def __init__(self) -> None:
        self.logged: list[str] = []

    def event(self, source: str, line: str) -> None: ...

    def log(self, source: str, line: str) -> None:
        self.logged.append(line)


def _stream(tmp_path: Path, text: str) -> tuple[ProcessStream, Kept, list[SessionEvent]]:
    """`text` written on stderr by a real process on a local host, read to its end by a ProcessStream."""
    kept, events = Kept(), []
    stream = ProcessStream("h1", "h1", kept, events.append)
    script = tmp_path / "noise.txt"
    script.write_text(text)

    async def main() -> int:
        t = LocalTransport(Host(name="h1", transport="local", workdir=str(tmp_path)))
        proc = await t.start([sys.executable, "-c", f"import sys; sys.stderr.write(open({str(script)!r}).read())"])
        proc.close_stdin()
        return await stream.consume(proc)

    assert asyncio.run(main()) == 0
    return stream, kept, events


def test_the_recorded_teardown_noise_reaches_the_log_only(tmp_path: Path) -> None:
    recorded = RECORDED.read_text()
    stream, kept, events = _stream(tmp_path, recorded + AFTER + "\n")
    lines = recorded.splitlines()
    assert len(lines) == 24 and "c10::Error::Error" in recorded and "recvValueWithTimeout failed" in recorded
    assert kept.logged == [*lines, AFTER]  # every line in the run's log
    shown = [e.line for e in events if isinstance(e, HostOutput)]
    assert shown == [AFTER]  # the host's own line after the noise is shown: the filter found the noise's end
    # The tail (what a failure would show) keeps the warning's own line, never the frames or the traceback.
    assert [line.removeprefix("h1: ") for line in stream.tail] == [lines[0], AFTER]
    out = io.StringIO()
    renderer = HeadlessRenderer(console=Console(file=out, width=80, soft_wrap=True))
    for event in events:
        renderer(event)
    assert out.getvalue().splitlines() == [f"h1 {AFTER}"]  # headless shows stderr lines that name an Error


def test_each_kind_of_noise_ends_where_it_ends() -> None:
    """A stack dump ends at its blank line, a traceback at its exception's line; gloo's abort on the way out is
    a headline; anything else, a rank's own traceback included, is shown."""
    noise = TorchNoise()
    judged = [noise.judge(line) for line in (
        "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:790 (most recent call "
        "first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f in libc10.so)",
        "<omitting python frames>",
        "",
        "[rank1]:[W1126 20:19:50.401458896 ProcessGroupGloo.cpp:812] Warning: Connection closed by peer",
        "terminate called after throwing an instance of 'gloo::IoException'",
        "  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1",
        "Traceback (most recent call last):",
        '  File "/x/remote/runtime/pipeline.py", line 3, in main',
        "RuntimeError: the rank's own failure",
        "[W1126 20:19:50.401458896 init.cpp:12] a torch warning about something else")]
    assert judged == [Verdict.QUIET] * 4 + [Verdict.HEADLINE] * 3 + [Verdict.SHOWN] * 4
