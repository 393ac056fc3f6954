"""The blame after a multi-host failure: a rank that died without a word, not the peers that reported it."""

from __future__ import annotations

import asyncio
import time

from pictl.cluster.culprit import await_culprit, silent_death

RANKS = {"h0": [0, 1], "h1": [2], "h2": [3]}


def test_the_silent_rank_on_a_host_that_exited_is_the_cause_not_the_peer_that_reported() -> None:
    errors = {3}  # rank 3 reported "connection closed by peer"; rank 2 was killed
    found = silent_death({"h2": 1, "h1": -9}, RANKS, reported=lambda r: r in errors, errored=lambda r: r in errors)
    assert (found.host, found.rank, found.returncode) == ("h1", 2, -9)
    assert "without reporting an error" in found.message and "-9" in found.message


def test_a_rank_stopped_by_its_own_torchrun_after_a_siblings_error_is_not_the_cause() -> None:
    errors = {1}  # rank 1 raised; torchrun on h0 then stopped rank 0 before it could say anything
    assert silent_death({"h0": 1}, RANKS, reported=lambda r: r in errors, errored=lambda r: r in errors) is None


def test_a_host_still_being_read_is_not_blamed_and_the_wait_ends_when_every_host_ended() -> None:
    ended: dict[str, int] = {"h2": 1}
    errors = {3}

    async def go() -> tuple[object, float]:
        async def h1_exits_late() -> None:
            await asyncio.sleep(0.5)  # a loaded host's torchrun notices its dead rank late
            ended["h1"] = 1

        started = time.monotonic()
        task = asyncio.create_task(h1_exits_late())
        found = await await_culprit(ended, RANKS, lambda r: r in errors, lambda r: r in errors, most=5)
        await task
        return found, time.monotonic() - started

    found, waited = asyncio.run(go())
    assert found is not None and found.host == "h1" and 0.4 < waited < 2
    # Every host ended with only reported errors: no silent death, and no waiting out `most`.
    started = time.monotonic()
    every_host_ended = {"h0": 1, "h1": 1, "h2": 1}
    assert asyncio.run(await_culprit(every_host_ended, RANKS, lambda r: True, lambda r: True, most=5)) is None
    assert time.monotonic() - started < 1
