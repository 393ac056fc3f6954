"""The comparison engine's statistics (`pictl.records.compare_stats`): a 2x gap separates, identical
configurations do not (at the rate the module states, added rounds included), a verdict reads the same both
ways round, and ties share a place; `pictl runs compare` judges two runs of one sweep by its rounds
(`pictl.records.run_verdicts`)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pictl.records.compare_stats import (
    DECISION_CONFIDENCE,
    Rounds,
    compare,
    looks_for,
    more_rounds,
    rank,
    spread,
    t_quantile,
)
from pictl.records.run_verdicts import verdict_of
from pictl.summary_models import RunSummary

SETTINGS = settings(max_examples=300, deadline=None, database=None)


@pytest.mark.parametrize(("confidence", "df", "table"), [(0.95, 2, 4.303), (0.99, 2, 9.925), (0.95, 9, 2.262),
                                                         (0.99, 5, 4.032), (0.95, 1, 12.706), (0.90, 30, 1.697)])
def test_t_quantiles_are_the_tables(confidence: float, df: int, table: float) -> None:
    assert t_quantile(confidence, df) == pytest.approx(table, abs=5e-4)


def _noisy(true: float, noise: float, draw: st.DrawFn) -> float:
    return true * draw(st.floats(1 - noise, 1 + noise))


@st.composite
def gap_rounds(draw: st.DrawFn, gap: float, noise: float, n: int) -> tuple[list[float], list[float]]:
    """`n` rounds of a candidate `gap` times faster than another, every measurement off by up to `noise`; each
    round's machine speed anywhere in 0.3-1.0 (load that hits both alike)."""
    speeds = [draw(st.floats(0.3, 1.0)) for _ in range(n)]
    return ([_noisy(gap * 8 * s, noise, draw) for s in speeds], [_noisy(8 * s, noise, draw) for s in speeds])


@SETTINGS
@given(gap_rounds(2.0, 0.03, 3))
def test_a_2x_gap_within_3_percent_noise_separates_in_3_rounds(rounds: tuple[list[float], list[float]]) -> None:
    fast, slow = rounds
    assert compare("A", fast, "B", slow).outcome == "faster"
    assert compare("B", slow, "A", fast).outcome == "slower"


@SETTINGS
@given(gap_rounds(2.0, 0.10, 6))
def test_a_2x_gap_within_10_percent_noise_separates_in_6_rounds(rounds: tuple[list[float], list[float]]) -> None:
    fast, slow = rounds
    verdict = compare("A", fast, "B", slow)
    assert verdict.winner == "A" and verdict.text().startswith("A is faster than B by ")


@SETTINGS
@given(st.lists(st.floats(0.5, 50), min_size=1, max_size=10))
def test_the_same_figures_are_never_a_winner(ips: list[float]) -> None:
    verdict = compare("A", ips, "B", list(ips))
    assert verdict.tie and verdict.winner is None
    assert "a tie within noise" in verdict.text()


@SETTINGS
@given(st.lists(st.tuples(st.floats(0.5, 50), st.floats(0.5, 50)), min_size=2, max_size=10))
def test_a_verdict_reads_the_same_both_ways_round(pairs: list[tuple[float, float]]) -> None:
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    there, back = compare("A", a, "B", b), compare("B", b, "A", a)
    assert there.winner == back.winner
    assert there.tie == back.tie


def test_identical_configurations_are_called_different_under_1_in_100_with_added_rounds() -> None:
    """The stated rate, by simulation: two configurations that are the same, each round's figures scattered by
    15 % (this machine kind's noise between runs, docs/benchmarks.md) and the machine's speed drifting; 3
    rounds, then one more while too close to call, up to 6, deciding at each look."""
    rng = random.Random(43)
    trials, wrong = 3000, 0
    for _ in range(trials):
        a: list[float] = []
        b: list[float] = []
        verdict = None
        while len(a) < 6:
            speed = rng.uniform(0.4, 1.0)
            a.append(8 * speed * math.exp(rng.gauss(0, 0.15)))
            b.append(8 * speed * math.exp(rng.gauss(0, 0.15)))
            if len(a) >= 3:
                verdict = compare("A", a, "B", b, looks=looks_for(3, 6))
                if verdict.outcome != "too close to call":
                    break
        assert verdict is not None
        wrong += verdict.winner is not None
    assert wrong / trials <= 1 - DECISION_CONFIDENCE + 0.004, f"{wrong} of {trials} called different"


def test_a_failed_round_is_left_out_of_the_pairs_it_touches() -> None:
    verdict = compare("A", [16.0, None, 16.2, 15.9], "B", [8.0, 8.1, None, 8.05])
    assert verdict.ratio is not None and verdict.ratio.rounds == 2


def test_ties_share_a_place_and_a_clear_gap_does_not() -> None:
    rounds = Rounds()
    for k, speed in enumerate([1.0, 0.7, 0.9, 0.6, 1.0]):  # the machine's speed, round by round
        wobble = 1 + 0.01 * (-1) ** k
        rounds.add(4.0 * speed, {"fast": 16.0 * speed * wobble, "twin": 16.0 * speed / wobble, "slow": 8.0 * speed})
    ranking = rank(rounds)
    places = {e.name: e.place for e in ranking.entries}
    assert places["fast"] == places["twin"] == 1 and places["slow"] == 3
    assert sorted(ranking.winners) == ["fast", "twin"]
    fast = next(e for e in ranking.entries if e.name == "fast")
    assert fast.speedup is not None and fast.speedup.median == pytest.approx(4.0 * 1.01, rel=0.02)
    assert "slow" not in fast.tied_with and "twin" in fast.tied_with
    assert ranking.verdict("slow", "fast").outcome == "slower"
    assert ranking.reference is not None and ranking.reference.rounds == 5


def test_more_rounds_only_while_neighbours_are_too_close_and_room_is_left() -> None:
    rounds = Rounds()
    for speed, wobble in [(1.0, 1.2), (0.6, 0.85), (0.9, 1.1)]:
        rounds.add(4.0 * speed, {"a": 10.0 * speed * wobble, "b": 10.0 * speed})
    ranking = rank(rounds, looks=looks_for(3, 6))
    assert ranking.undecided()
    assert "too close to call after 3 round(s)" in (more_rounds(ranking, 3, max_rounds=6) or "")
    assert more_rounds(ranking, 6, max_rounds=6) is None
    assert more_rounds(ranking, 3, max_rounds=6, elapsed_s=100, longest_round_s=40, budget_s=120) is None


def test_a_spread_of_one_round_has_no_interval_yet() -> None:
    one = spread([8.0])
    assert not one.known and one.text() == "8.00 (8.00-8.00)"
    several = spread([8.0, 8.4, 7.6])
    assert several.low is not None and several.high is not None
    assert several.low < several.median < several.high and several.least == 7.6


def _run(run_id: str, sweep: Path, configuration: str, role: str = "candidate", kind: str = "sweep") -> RunSummary:
    return RunSummary.model_validate({"status": "ok", "run_id": run_id, "stages": 2, "part_of": {
        "kind": kind, "name": sweep.name, "dir": str(sweep), "round": 1, "role": role,
        "configuration": configuration}})


def test_runs_compare_judges_two_runs_of_one_sweep_by_its_rounds(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    rounds = [{"round": k, "reference": {"ips": 4.0 * s}, "runs": {"fast": {"ips": 16.0 * s}, "slow": {"ips": 8.0 * s}}}
              for k, s in enumerate([1.0, 0.6, 0.9, 0.7], start=1)]
    (sweep / "sweep.json").write_text(json.dumps({"rounds": rounds, "plan": {"rounds": 4, "max_rounds": 4}}))
    fast, slow, ref = _run("a", sweep, "fast"), _run("b", sweep, "slow"), _run("r", sweep, "x", "reference")
    judged = verdict_of(slow, fast)
    assert judged["outcome"] == "faster" and judged["winner"] == "fast"
    assert judged["text"].startswith("in sweep sweep: fast is faster than slow by 100.0 %")
    assert verdict_of(ref, slow)["winner"] == "slow"
    assert verdict_of(fast, _run("c", sweep, "fast"))["text"].startswith("no verdict: two rounds of one configuration")
    apart = _run("d", tmp_path / "elsewhere", "slow")
    assert verdict_of(fast, apart)["outcome"] is None and "not measured in one sweep" in verdict_of(fast, apart)["text"]
    (sweep / "sweep.json").rename(sweep / "real.json")
    (sweep / "sweep.json").symlink_to(sweep / "real.json")  # a link is never read through
    assert "cannot be read" in verdict_of(slow, fast)["text"]


def test_runs_compare_judges_two_finalists_of_one_tune_by_its_rounds(tmp_path: Path) -> None:
    """A tune's rows carry their rounds (each against its round's reference): two finalists are judged by them,
    a candidate screened once and never in rounds gets no verdict, and a sweep's run is not a tune's."""
    tune = tmp_path / "tune"
    tune.mkdir()

    def row(label: str, per_round: list[float | None], **extra) -> dict:
        return {"candidate": label, **extra, "rounds": [
            {"round": k, "run_id": f"{label}{k}", "ips": v, "reference_ips": 4.0, "speedup": v / 4.0}
            for k, v in enumerate(per_round, start=1) if v is not None]}

    rows = [row("1x3", [12.0, 7.3, 11.0, 8.6]), row("1x2", [8.1, 7.2, 8.0, 7.9]),
            row("serial", [4.0, 2.4, 3.6, 2.8], reference=True), row("2x2", [])]
    (tune / "tune.json").write_text(json.dumps({"rows": rows, "plan": {"rounds": 3, "max_rounds": 9}}))
    three, two = _run("a", tune, "1x3", kind="tune"), _run("b", tune, "1x2", kind="tune")
    judged = verdict_of(two, three)
    assert judged["text"].startswith("in tune tune: 1x3 and 1x2: a tie within noise") and judged["winner"] is None
    loud = [12.0, 7.3, 11.0, 8.6]  # the same rounds, in a tune whose 1x2 is always half as fast: a clear winner
    rows[1] = row("1x2", [v / 2 for v in loud])
    (tune / "tune.json").write_text(json.dumps({"rows": rows, "plan": {"rounds": 3, "max_rounds": 9}}))
    judged = verdict_of(two, three)
    assert judged["outcome"] == "faster" and judged["winner"] == "1x3", judged
    assert verdict_of(_run("r", tune, "serial", "reference", kind="tune"), three)["winner"] == "1x3"
    screened = verdict_of(three, _run("c", tune, "2x2", kind="tune"))
    assert screened["outcome"] is None and "finalists" in screened["text"]
    assert "not measured in one sweep or tune" in verdict_of(three, _run("d", tune, "1x2"))["text"]
