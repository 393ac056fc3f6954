"""`pictl runs compare`'s verdict: two runs of one comparison (a sweep or a tune) judged as it judged them.

A run a sweep or a tune made names it (`part_of`: the comparison's directory, the round, its configuration and
whether it was the reference). Two such runs of the same comparison are compared by their configurations' img/s
in its rounds (sweep.json's rounds; tune.json's rows, each with its rounds), round by round, with the
statistics every comparison uses (`compare_stats.compare`): "A is faster than B by X % (interval)" or "a tie
within noise". Runs measured apart (not in one comparison) had no shared reference and no interleaving: their
figures are set side by side, and no verdict is given. A tune's candidates screened by one run only, never in
rounds, have no series to compare: that is said.

sweep.json and tune.json are read from where the record says, as a record is: never through a link, at most
16 MiB, and whatever they hold is checked before it is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict

from pictl.errors import ConfigError
from pictl.records.compare_stats import compare, looks_for
from pictl.records.files import read_regular
from pictl.summary import terminal_text
from pictl.summary_models import RunSummary

__all__ = ["verdict_of"]

MAX_SWEEP_BYTES = 16 << 20
REFERENCE = "reference"
KINDS = ("sweep", "tune")
Series = dict[str, dict[int, float]]
"""Each configuration's img/s by round number (rounds where it failed or did not run are absent)."""


def verdict_of(a: RunSummary, b: RunSummary) -> dict[str, Any]:
    """B against A: `{"text": ..., "outcome": ..., "winner": ...}` when they are runs of one sweep, else a text
    saying why there is no verdict (outcome None)."""
    pa, pb = a.part_of, b.part_of
    if pa is None or pb is None or pa.kind not in KINDS or pb.kind != pa.kind or pa.dir != pb.dir:
        return _none("not measured in one sweep or tune (no shared reference, no interleaved rounds): "
                     "measure them together with `pictl sweep`")
    kind, where = pa.kind, terminal_text(pa.name, 80)
    name_a, name_b = _config(pa), _config(pb)
    if name_a == name_b:
        return _none(f"two rounds of one configuration ({terminal_text(name_a, 80)}): the {kind}'s row gives its "
                     "spread")
    try:
        series, plan = (_rounds if kind == "sweep" else _tune_rounds)(Path(pa.dir))
    except (OSError, ValueError, ConfigError) as exc:
        return _none(f"{kind} {where}: its {kind}.json cannot be read ({terminal_text(exc, 120)})")
    ips_a, ips_b = _aligned(series.get(name_a, {}), series.get(name_b, {}))
    if not any(v is not None for v in ips_a) or not any(v is not None for v in ips_b):
        return _none(f"{kind} {where}: its rounds do not hold both configurations (a tune measures only its "
                     "finalists in rounds)" if kind == "tune" else
                     f"{kind} {where}: its rounds do not hold both configurations")
    verdict = compare(terminal_text(name_b, 80), ips_b, terminal_text(name_a, 80), ips_a,
                      looks=looks_for(*plan))
    return {"text": f"in {kind} {where}: {verdict.text()}", "outcome": verdict.outcome,
            "winner": verdict.winner, "ratio": verdict.ratio.to_json() if verdict.ratio else None}


def _none(why: str) -> dict[str, Any]:
    return {"text": f"no verdict: {why}", "outcome": None, "winner": None, "ratio": None}


def _config(part: Any) -> str:
    return REFERENCE if part.role == REFERENCE else str(part.configuration or "")


class _Loose(BaseModel):
    """A part of sweep.json or tune.json read by name, each value as it is (checked where it is used: a file
    from another pictl, or edited, may hold anything)."""

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def of(cls, value: Any) -> Self:
        """`value` read by field when it is an object; else as an empty one (every field None)."""
        return cls.model_validate(value) if isinstance(value, dict) else cls()


class _Plan(_Loose):
    rounds: Any = None
    max_rounds: Any = None


class _Measured(_Loose):
    """One configuration's run in a round: its img/s (a tune's row also says which round)."""

    round: Any = None
    ips: Any = None


class _SweepRound(_Loose):
    reference: Any = None
    runs: Any = None


class _TuneRow(_Loose):
    reference: Any = None
    candidate: Any = None
    rounds: Any = None


class _Comparison(_Loose):
    """sweep.json (its `rounds`) or tune.json (its `rows`), with the plan of rounds they ran."""

    rounds: Any = None
    rows: Any = None
    plan: Any = None


def _rounds(sweep_dir: Path) -> tuple[Series, tuple[int, int]]:
    """sweep.json's rounds as series, and its plan's (rounds, max_rounds)."""
    found = _Comparison.of(_read_json(sweep_dir, "sweep.json"))
    rounds = found.rounds
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        raise ValueError("no rounds in it (a sweep from an older pictl)")
    series: Series = {}
    for k, r in enumerate(map(_SweepRound.of, rounds), start=1):
        runs = r.runs if isinstance(r.runs, dict) else {}
        for name, run in [(REFERENCE, r.reference), *runs.items()]:
            ips = _ips(_Measured.of(run).ips)
            if ips is not None:
                series.setdefault(str(name), {})[k] = ips
    plan = _Plan.of(found.plan)
    return series, _plan(plan.rounds, plan.max_rounds, len(rounds))


def _tune_rounds(tune_dir: Path) -> tuple[Series, tuple[int, int]]:
    """tune.json's rows' rounds as series (the reference's row under REFERENCE), and its plan's (rounds,
    max_rounds)."""
    found = _Comparison.of(_read_json(tune_dir, "tune.json"))
    if not isinstance(found.rows, list):
        raise ValueError("no rows in it")
    series: Series = {}
    most = 0
    for row in (_TuneRow.of(r) for r in found.rows if isinstance(r, dict)):
        if not isinstance(row.rounds, list):
            continue
        name = REFERENCE if row.reference is True else str(row.candidate or "")
        for measured in map(_Measured.of, row.rounds):  # (a round that is no object: every field None)
            k, ips = measured.round, _ips(measured.ips)
            if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 100 and ips is not None:
                series.setdefault(name, {})[k] = ips
                most = max(most, k)
    plan = _Plan.of(found.plan)
    return series, _plan(plan.rounds, plan.max_rounds, most)


def _read_json(directory: Path, name: str) -> dict[str, Any]:
    data = read_regular(directory, name, MAX_SWEEP_BYTES)
    if data is None:
        raise ValueError(f"more than {MAX_SWEEP_BYTES >> 20} MiB")
    found = json.loads(data.decode("utf-8"))
    if not isinstance(found, dict):
        raise ValueError("not a JSON object")
    return found


def _plan(first: Any, most: Any, measured: int) -> tuple[int, int]:
    """(rounds, max_rounds) as planned, when they are sane; else as many as were measured."""
    if isinstance(first, int) and isinstance(most, int) and not isinstance(first, bool) \
            and not isinstance(most, bool) and 1 <= first <= most <= 100:
        return first, most
    return max(1, measured), max(1, measured)


def _ips(value: Any) -> float | None:
    good = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e9
    return float(value) if good else None


def _aligned(a: dict[int, float], b: dict[int, float]) -> tuple[list[float | None], list[float | None]]:
    """Both series over the rounds either ran in, in round order (None where one did not run or failed)."""
    rounds = sorted(set(a) | set(b))
    return [a.get(k) for k in rounds], [b.get(k) for k in rounds]
