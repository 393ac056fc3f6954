"""How every view writes a run's figures: one function per kind of figure.

The result line, `pictl runs` (list, show, compare), `pictl report`, the dashboard (run panel and history) and
the docs write a speedup the same way (`2.01x`: rounded to two places, never cropped), a waterfall term the
same way (signed points of speedup, a loss negative: `-1.27`, a gain `+0.54`), and a share of the gap the
same way (`36%`). A view that formats one of these by hand is a place where two views drift apart; a test
renders one summary through every view and finds the same strings in each.

A summary model declares each of its figures once, on its field (`Figure`: label, unit, format, which way is
better, one line of help, as `Annotated` metadata); the views iterate `figures(model)` instead of naming
`speedup` or `throughput_ips` by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

__all__ = ["Figure", "cell_text", "declared", "efficiency_text", "energy_text", "figure_of", "figures", "ips_text",
           "joules_text", "ms_text", "percent_text", "points_text", "share_text", "speedup_text", "watts_text"]


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


def tokens_text(value: Any) -> str:
    """Tokens per second, one place (`48.3`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{v:.1f}"


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


def watts_text(value: Any) -> str:
    """Watts, two places (`2.95`), or `-`."""
    v = _number(value)
    return "-" if v is None else f"{v:.2f}"


def percent_text(value: Any) -> str:
    """A share of images as a percentage, two places (`81.25%`), or `n/a` (no labels, no comparison)."""
    v = _number(value)
    return "n/a" if v is None else f"{v:.2%}"


def energy_text(pipeline: Any, serial: Any) -> str:
    """Energy per image, the pipeline's beside the serial run's: `5.12 J/img (serial 4.98)`, `n/a`."""
    if _number(pipeline) is None and _number(serial) is None:
        return "n/a"
    return f"{joules_text(pipeline)} J/img (serial {joules_text(serial)})"


@dataclass(frozen=True)
class Figure:
    """A figure as its summary model declares it, on its field: `Annotated[float | None, Figure(...)]`."""

    label: str
    """What the result line and `runs show` call it (`pipeline`, `speedup`)."""
    unit: str
    """`img/s`, `tok/s`, `x`, `J/img`, `W`, `ms`; `%` for a share of images, `` for a plain ratio."""
    text: Callable[[Any], str]
    """The one function of this module that writes it (`speedup_text`: `2.01x`); a missing value included."""
    better: Literal["higher", "lower"] | None
    """Which way is better (None: neither; a power draw is only a reading)."""
    help: str
    """One line: what the figure measures."""

    def shown(self, value: Any) -> str:
        """The value with its unit, as every view writes it: `7.70 img/s`, `2.01x`, `81.25%`, `0.450 J/img`
        (`- img/s` when there is none; a speedup and a percentage carry their unit in the number)."""
        text = self.text(value)
        return text if self.unit in ("", "x", "%") else f"{text} {self.unit}"

    def heading(self) -> str:
        """A table's heading for it: its label, with its unit where the cells do not carry it (`serial img/s`)."""
        return self.label if self.unit in ("", "x", "%") else f"{self.label} {self.unit}"

    def field(self, value: Any) -> str:
        """Label, value and unit, as the result line and `runs show` write them: `pipeline 7.70 img/s`."""
        return f"{self.label} {self.shown(value)}"


def declared(model: type[BaseModel]) -> Iterator[tuple[str, Figure]]:
    """The figures a summary model declares, in its fields' order: (field name, its `Figure`)."""
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Figure):
                yield name, meta


def figures(record: BaseModel | None) -> Iterator[tuple[str, Figure, Any]]:
    """A summary record's declared figures with their values, in order (nothing for None: a record from before
    it, a run that did not get that far)."""
    if record is not None:
        for name, fig in declared(type(record)):
            yield name, fig, getattr(record, name)


def figure_of(model: type[BaseModel], name: str) -> Figure:
    """The `Figure` that `model` declares on its field `name` (KeyError: it declares none there)."""
    found = dict(declared(model))
    return found[name]


def cell_text(key: str, value: Any, declared_as: Figure | None = None) -> str | None:
    """A catalog row's figure as every table shows it (`pictl runs`, `runs compare`, the dashboard's history),
    or None when `key` is not a figure this module writes (the caller shows it as it is). `declared_as`: the
    figure the summary declares under `key`, when it does."""
    if value is None:
        return "-"
    if declared_as is not None:
        return declared_as.text(value)
    if key.endswith("_points"):
        return points_text(value)
    if key.endswith("_ms"):
        return ms_text(value)
    if key.endswith("_j_per_image"):
        return joules_text(value)
    return None
