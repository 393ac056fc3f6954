"""How every view writes a run's figures: one function per kind of figure.

The result line, `pictl runs` (list, show, compare), `pictl report`, the dashboard (run panel and history) and
the docs write a speedup the same way (`2.01x`: rounded to two places, never cropped), a waterfall term the
same way (signed points of speedup, a loss negative: `-1.27`, a gain `+0.54`), and a share of the gap the
same way (`36%`). A view that formats one of these by hand is a place where two views drift apart; a test
renders one summary through every view and finds the same strings in each.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["cell_text", "efficiency_text", "energy_text", "ips_text", "joules_text", "ms_text", "points_text",
           "share_text", "speedup_text"]


def _number(value: Any) -> float | None:
    """A finite number, or None (missing, a string a record held, NaN or an infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def speedup_text(value: Any) -> str:
    """`2.01x` (two places, rounded), or `-` when there is none."""
    v = _number(value)
    return "-" if v is None else f"{v:.2f}x"


def interval_text(low: Any, high: Any) -> str:
    """An interval over rounds, `1.71-1.98` (two places), or `-` when it has no two ends yet."""
    lo, hi = _number(low), _number(high)
    return "-" if lo is None or hi is None else f"{lo:.2f}-{hi:.2f}"


def points_text(value: Any) -> str:
    """Points of speedup a waterfall term changed, signed: a loss `-1.27`, a gain `+0.54`; `-` when none."""
    v = _number(value)
    if v is None:
        return "-"
    v = round(v, 2)
    return f"{v + 0.0:+.2f}"  # + 0.0: a term that rounds to nothing reads +0.00, never -0.00


def share_text(value: Any) -> str:
    """A share of the gap as a whole percentage (`36%`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{round(v, 2) + 0.0:.0%}"  # (never -0%)


def ips_text(value: Any) -> str:
    """Images per second, two places (`7.70`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{v:.2f}"


def efficiency_text(value: Any) -> str:
    """Speedup over the ideal, two places (`0.85`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{v:.2f}"


def ms_text(value: Any) -> str:
    """Milliseconds, one place (`12.3`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{v:.1f}"


def joules_text(value: Any) -> str:
    """Joules per image to three significant digits, trailing zeros kept (`5.12`, `0.450`, `123`), or `n/a`
    (no meter: never a guess)."""
    v = _number(value)
    if v is None:
        return "n/a"
    places = next((p for p, floor in ((0, 100), (1, 10), (2, 1)) if abs(v) >= floor), 3)
    return f"{v:.{places}f}"


def energy_text(pipeline: Any, serial: Any) -> str:
    """Energy per image, the pipeline's beside the serial run's: `5.12 J/img (serial 4.98)`, `n/a`."""
    if _number(pipeline) is None and _number(serial) is None:
        return "n/a"
    return f"{joules_text(pipeline)} J/img (serial {joules_text(serial)})"


_BY_KEY = {"speedup": speedup_text, "throughput_ips": ips_text, "serial_ips": ips_text,
           "efficiency": efficiency_text}


def cell_text(key: str, value: Any) -> str | None:
    """A catalog row's figure as every table shows it (`pictl runs`, `runs compare`, the dashboard's history),
    or None when `key` is not a figure this module writes (the caller shows it as it is)."""
    if value is None:
        return "-"
    if key in _BY_KEY:
        return _BY_KEY[key](value)
    if key.endswith("_points"):
        return points_text(value)
    if key.endswith("_ms"):
        return ms_text(value)
    if key.endswith("_j_per_image"):
        return joules_text(value)
    return None
