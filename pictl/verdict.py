"""A finished run's verdict: OK, or SUSPECT with its cause in one line, and the exit code it ends with.

The sanity flags (`pictl.run.flags`) say what each saw; the ones that make the result untrue carry
`invalidates`: a speedup above the ranks, or above what filling and draining leave of them (no exact pipeline
reaches either), and a serial baseline that something else slowed while it was measured (overloaded,
throttled or hot: every speedup divided by it reads high) or that was reused although its host changed. A
result with one is SUSPECT wherever it is shown: the result line's first word, `pictl runs`' status column,
`runs show`, the dashboard's run panel and history, and `pictl run` exits `EXIT_SUSPECT`. The other flags
warn: the figures stand.
"""

from __future__ import annotations

from collections.abc import Sequence

from pictl import errors as E
from pictl.summary_models import RunSummary, SanityFlag

__all__ = ["IMPOSSIBLE", "result_word", "shown_status", "suspect_error", "verdict_of"]

IMPOSSIBLE = ("speedup_above_stages", "speedup_above_fill_drain")
"""Codes that invalidate a result even in a record written before flags said so (an impossible speedup)."""


def verdict_of(flags: Sequence[SanityFlag]) -> tuple[str, str | None]:
    """`("ok", None)`, or `("suspect", the cause in one line)`: the first invalidating flag's code and message,
    and the codes of any others."""
    bad = [f for f in flags if f.invalidates or f.code in IMPOSSIBLE]
    if not bad:
        return "ok", None
    first = " ".join(bad[0].message.split())
    more = list(dict.fromkeys(f.code for f in bad[1:] if f.code != bad[0].code))
    return "suspect", f"{bad[0].code}: {first}" + (f" (also {', '.join(more)})" if more else "")


def _verdict(s: RunSummary) -> tuple[str, str | None] | None:
    if s.status != "ok":
        return None
    if s.verdict is not None:
        return s.verdict, s.suspect_because
    return verdict_of(s.flags)  # an older record: read from its flags


def shown_status(s: RunSummary) -> str:
    """What a status column shows: `suspect` for a finished run whose result is SUSPECT, else its status."""
    found = _verdict(s)
    return found[0] if found else s.status


def result_word(s: RunSummary) -> str:
    """The result line's first word: OK, SUSPECT, FAILED or INTERRUPTED."""
    return shown_status(s).upper()


def suspect_error(s: RunSummary) -> E.Suspect | None:
    """The error a SUSPECT result ends with (its one line names the cause), or None when the result stands."""
    found = _verdict(s)
    if found is None or found[0] != "suspect":
        return None
    return E.Suspect(f"SUSPECT: {found[1] or 'a sanity flag invalidates the result'}")
