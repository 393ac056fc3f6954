"""`pictl runs compare`'s verdict: two runs of one comparison (a sweep) judged as the sweep judged them.

A run a sweep made names it (`part_of`: the sweep's directory, the round, its configuration and whether it was
the reference). Two such runs of the same sweep are compared by their configurations' img/s in the sweep's
rounds (sweep.json), round by round, with the statistics every comparison uses (`compare_stats.compare`):
"A is faster than B by X % (interval)" or "a tie within noise". Runs measured apart (not in one sweep) had no
shared reference and no interleaving: their figures are set side by side, and no verdict is given.

sweep.json is read from where the record says, as a record is: never through a link, at most 16 MiB, and
whatever it holds is checked before it is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pictl.errors import ConfigError
from pictl.records.compare_stats import compare, looks_for
from pictl.records.files import read_regular
from pictl.summary import terminal_text
from pictl.summary_models import RunSummary

__all__ = ["verdict_of"]

MAX_SWEEP_BYTES = 16 << 20
REFERENCE = "reference"


def verdict_of(a: RunSummary, b: RunSummary) -> dict[str, Any]:
    """B against A: `{"text": ..., "outcome": ..., "winner": ...}` when they are runs of one sweep, else a text
    saying why there is no verdict (outcome None)."""
    pa, pb = a.part_of, b.part_of
    if pa is None or pb is None or pa.kind != "sweep" or pb.kind != "sweep" or pa.dir != pb.dir:
        return _none("not measured in one sweep (no shared reference, no interleaved rounds): "
                     "measure them together with `pictl sweep`")
    name_a, name_b = _config(pa), _config(pb)
    if name_a == name_b:
        return _none(f"two rounds of one configuration ({terminal_text(name_a, 80)}): the sweep's row gives its "
                     "spread")
    try:
        rounds, plan = _rounds(Path(pa.dir))
    except (OSError, ValueError, ConfigError) as exc:
        return _none(f"sweep {terminal_text(pa.name, 80)}: its sweep.json cannot be read ({terminal_text(exc, 120)})")
    ips_a, ips_b = _series(rounds, name_a), _series(rounds, name_b)
    if not any(v is not None for v in ips_a) or not any(v is not None for v in ips_b):
        return _none(f"sweep {terminal_text(pa.name, 80)}: its rounds do not hold both configurations")
    verdict = compare(terminal_text(name_b, 80), ips_b, terminal_text(name_a, 80), ips_a,
                      looks=looks_for(*plan))
    return {"text": f"in sweep {terminal_text(pa.name, 80)}: {verdict.text()}", "outcome": verdict.outcome,
            "winner": verdict.winner, "ratio": verdict.ratio.to_json() if verdict.ratio else None}


def _none(why: str) -> dict[str, Any]:
    return {"text": f"no verdict: {why}", "outcome": None, "winner": None, "ratio": None}


def _config(part: Any) -> str:
    return REFERENCE if part.role == REFERENCE else str(part.configuration or "")


def _rounds(sweep_dir: Path) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """sweep.json's rounds and its plan's (rounds, max_rounds)."""
    data = read_regular(sweep_dir, "sweep.json", MAX_SWEEP_BYTES)
    if data is None:
        raise ValueError(f"more than {MAX_SWEEP_BYTES >> 20} MiB")
    found = json.loads(data.decode("utf-8"))
    rounds = found.get("rounds") if isinstance(found, dict) else None
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        raise ValueError("no rounds in it (a sweep from an older pictl)")
    plan = found.get("plan") if isinstance(found.get("plan"), dict) else {}
    first, most = plan.get("rounds"), plan.get("max_rounds")
    if isinstance(first, int) and isinstance(most, int) and not isinstance(first, bool) \
            and not isinstance(most, bool) and 1 <= first <= most <= 100:
        return rounds, (first, most)
    return rounds, (len(rounds), len(rounds))


def _series(rounds: list[dict[str, Any]], name: str) -> list[float | None]:
    """`name`'s img/s in each round (None where it did not run or failed)."""
    out: list[float | None] = []
    for r in rounds:
        runs = r.get("runs")
        run = r.get(REFERENCE) if name == REFERENCE else runs.get(name) if isinstance(runs, dict) else None
        ips = run.get("ips") if isinstance(run, dict) else None
        good = isinstance(ips, int | float) and not isinstance(ips, bool) and 0 < ips < 1e9
        out.append(float(ips) if good and ips is not None else None)
    return out
