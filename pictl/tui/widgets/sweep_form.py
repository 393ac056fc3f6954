"""The form that starts a sweep: stage counts, chunk sizes, policies, profile.

What it leaves empty comes from the preset's [sweep] table, else `SweepSettings`' defaults, which its
placeholders show; its values are read as `pictl sweep`'s flags are (`plan_sweep`, `given_options`)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select

from pictl import errors as E
from pictl.inventory import Cluster
from pictl.jobs.sweep import SweepPoint, plan_sweep
from pictl.planning.options import RunOptions, given_options
from pictl.planning.presets import SweepSettings, available_presets
from pictl.tui.widgets.form_screen import FormScreen


class SweepForm(FormScreen[tuple[RunOptions, list[SweepPoint], str | None] | None]):
    """Dismisses with (base options, points, profile) once every combination fits the inventory."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster

    def compose(self) -> ComposeResult:
        defaults = SweepSettings()
        with Vertical(id="run-form"):
            yield Label("Start a sweep (every combination against one serial reference)", classes="form-title")
            yield Label("profile (its [sweep] table fills what you leave empty)")
            yield Select([(p, p) for p in available_presets()], prompt="none", id="profile")
            yield Label("stages")
            yield Input("", placeholder=_listed(defaults.stages), id="stages")
            yield Label("chunks")
            yield Input("", placeholder=_listed(defaults.chunks), id="chunks")
            yield Label("policies")
            yield Input("", placeholder=_listed(defaults.policy), id="policies")
            yield Label("images per pass")
            yield Input("", placeholder="from the profile", id="images", type="integer")
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Sweep", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _value(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value.strip()

    def _submit(self) -> None:
        profile = self.query_one("#profile", Select).value
        profile = None if profile is Select.NULL else str(profile)
        try:
            images = self._value("images")
            base, points = plan_sweep(self.cluster, profile, given_options({"images": int(images) if images else None}),
                                      stages=self._value("stages"), chunks=self._value("chunks"),
                                      policies=self._value("policies"), names=("stages", "chunks", "policies"))
        except (E.PictlError, ValueError) as exc:
            self.show_error(exc)
            return
        self.dismiss((base, points, profile))


def _listed(values: Sequence[object]) -> str:
    return ",".join(map(str, values))
