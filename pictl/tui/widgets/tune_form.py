"""The form that starts a tune: the preset it searches from, exact or with a bounded loss, how many
candidates to measure, the time budget, and the protocol fields `pictl tune` takes (threads and chunk left
empty are searched). Its values are resolved as `pictl tune`'s flags are (`plan_tune`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select

from pictl import errors as E
from pictl.jobs.tune import TuneSettings, plan_tune
from pictl.jobs.tune_rounds import MAX_ROUNDS
from pictl.planning.options import RunOptions
from pictl.planning.presets import available_presets
from pictl.tui.widgets.form_screen import FormScreen

NAMES = {"images": "images per pass", "threads": "threads per rank", "chunk": "chunk", "measure": "measure",
         "budget": "budget (s)", "min_agreement": "min agreement", "max_rounds": "rounds at most"}
"""The form's labels, which its errors name (as the CLI's name its flags)."""


class TuneForm(FormScreen[tuple[RunOptions, TuneSettings, str | None] | None]):
    """Dismisses with (base options, settings, profile) once they resolve."""

    def compose(self) -> ComposeResult:
        with Vertical(id="run-form"):
            yield Label("Tune: the fastest configuration this cluster allows", classes="form-title")
            yield Label("profile (the protocol it searches under; the lab's fixes chunk 1)")
            yield Select([(p, p) for p in available_presets()], prompt="none", id="profile")
            yield Checkbox("allow a bounded loss (int8 numerics, compressing wires)", id="allow-loss")
            yield Label(NAMES["min_agreement"] + " (top-1 with the fp32 serial run)")
            yield Input("", placeholder="0.99", id="min_agreement")
            yield Label(NAMES["measure"] + " (candidates measured at most)")
            yield Input("", placeholder="3, or 5 with a loss allowed", id="measure", type="integer")
            yield Label(NAMES["budget"])
            yield Input("", placeholder="1800", id="budget", type="number")
            yield Label(NAMES["max_rounds"] + " (against the serial run; 3: a fixed count)")
            yield Input("", placeholder=str(MAX_ROUNDS), id="max_rounds", type="integer")
            yield Label(NAMES["images"])
            yield Input("", placeholder="from the profile", id="images", type="integer")
            yield Label("threads per rank, chunk (empty: searched unless the profile sets them)")
            with Horizontal(classes="pair"):
                yield Input("", placeholder="searched", id="threads", type="integer")
                yield Input("", placeholder="searched", id="chunk", type="integer")
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Tune", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _number(self, widget_id: str, kind: type[int] | type[float]) -> int | float | None:
        text = self.query_one(f"#{widget_id}", Input).value.strip()
        try:
            return kind(text) if text else None
        except ValueError:
            raise E.ConfigError(f"{NAMES[widget_id]}: {text!r} is not a number") from None

    def _submit(self) -> None:
        profile = self.query_one("#profile", Select).value
        profile = None if profile is Select.NULL else str(profile)
        try:
            agreement = self._number("min_agreement", float)
            if agreement is not None and not 0.0 <= agreement <= 1.0:
                raise E.ConfigError(f"{NAMES['min_agreement']}: {agreement} is not between 0 and 1")
            measure, budget = self._number("measure", int), self._number("budget", float)
            if measure is not None and not 1 <= measure <= 64 or budget is not None and budget < 1:
                raise E.ConfigError("measure: 1 to 64; budget: at least 1 s")
            rounds = self._number("max_rounds", int)
            base, settings = plan_tune(profile, {k: self._number(k, int) for k in ("images", "threads", "chunk")},
                                       allow_loss=self.query_one("#allow-loss", Checkbox).value,
                                       min_agreement=0.99 if agreement is None else agreement,
                                       measure=int(measure) if measure else None,
                                       budget_s=1800.0 if budget is None else float(budget),
                                       max_rounds=MAX_ROUNDS if rounds is None else int(rounds),
                                       name_of=lambda name: NAMES.get(name, name))
        except E.PictlError as exc:
            self.show_error(exc)
            return
        self.dismiss((base, settings, profile))
