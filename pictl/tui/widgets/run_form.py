"""The form that starts a run: stages, policy or split points, profile, chunk size, images.

Its choices, defaults and parsing are the command line's (`planning.options`): the same policies, the same
split-point parser, the same overrides handed to `resolve_options`."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select

from pictl import errors as E
from pictl.planning.options import POLICIES, RunOptions, default_of, given_options
from pictl.planning.presets import available_presets, resolve_options
from pictl.tui.widgets.form_screen import FormScreen


class RunForm(FormScreen[tuple[RunOptions, str | None] | None]):
    """Dismisses with (options, profile) once they validate; a bad value is shown in the form."""

    def __init__(self, last: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.last = last or {}

    def compose(self) -> ComposeResult:
        last = self.last
        profiles = [(p, p) for p in available_presets()]
        with Vertical(id="run-form"):
            yield Label("Start a run", classes="form-title")
            yield Label("profile")
            yield Select(profiles, prompt="none", value=last.get("profile") or Select.NULL, id="profile")
            yield Label("stages")
            yield Input(str(last.get("stages", "")), placeholder=f"from the profile (default {default_of('stages')})",
                        id="stages",
                        type="integer")
            yield Label("split policy")
            yield Select([(p, p) for p in POLICIES], value=last.get("policy", default_of("policy")), id="policy",
                         allow_blank=False)
            yield Label("split points (explicit), e.g. blocks.3,blocks.6,blocks.9")
            yield Input(last.get("split", ""), id="split")
            yield Label("chunk (microbatch size)")
            yield Input(str(last.get("chunk", "")), placeholder="from the profile", id="chunk", type="integer")
            yield Label("images per pass")
            yield Input(str(last.get("images", "")), placeholder="from the profile", id="images", type="integer")
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Run", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _int(self, widget_id: str) -> int | None:
        value = self.query_one(f"#{widget_id}", Input).value.strip()
        return int(value) if value else None

    def _submit(self) -> None:
        profile = self.query_one("#profile", Select).value
        profile = None if profile is Select.NULL else str(profile)
        policy = str(self.query_one("#policy", Select).value)
        given = {"stages": self._int("stages"), "policy": policy, "split": self.query_one("#split", Input).value.strip()
                 or None, "chunk": self._int("chunk"), "images": self._int("images")}
        try:
            overrides = given_options(given, name_of=_field_name)
            split = overrides["split"]
            if policy == "explicit" and not split:
                raise E.ConfigError("split points: the explicit policy needs them (or choose equal or balanced)")
            if split and policy != "explicit":  # typed, then the policy changed: say so rather than drop them
                raise E.ConfigError(f"split points are used by the explicit policy, not {policy}: choose explicit, "
                                    "or clear them")
            options = resolve_options(profile, overrides, source="run form", name_of=_field_name)
        except (E.PictlError, ValueError) as exc:
            self.show_error(exc)
            return
        self.dismiss((options, profile))


def _field_name(field: str) -> str:
    """What a bad value is blamed on: the form's label, not a flag."""
    return "split points" if field == "split" else field.replace("_", " ")
