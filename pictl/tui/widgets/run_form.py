"""The form that starts a run: stages, policy or split points, profile, chunk size, images."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select

from pictl import errors as E
from pictl.planning.profiles import RunOptions, available_profiles, resolve_options
from pictl.tui.widgets.form_screen import FormScreen

POLICIES = ("balanced", "equal", "explicit")


class RunForm(FormScreen[tuple[RunOptions, str | None] | None]):
    """Dismisses with (options, profile) once they validate; a bad value is shown in the form."""

    def __init__(self, last: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.last = last or {}

    def compose(self) -> ComposeResult:
        last = self.last
        profiles = [(p, p) for p in available_profiles()]
        with Vertical(id="run-form"):
            yield Label("Start a run", classes="form-title")
            yield Label("profile")
            yield Select(profiles, prompt="none", value=last.get("profile") or Select.NULL, id="profile")
            yield Label("stages")
            yield Input(str(last.get("stages", "")), placeholder="from the profile (default 2)", id="stages",
                        type="integer")
            yield Label("split policy")
            yield Select([(p, p) for p in POLICIES], value=last.get("policy", "balanced"), id="policy",
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
        split_text = self.query_one("#split", Input).value.strip()
        policy = str(self.query_one("#policy", Select).value)
        split = [p.strip() for p in split_text.split(",") if p.strip()]
        overrides = {"stages": self._int("stages"), "policy": policy, "split": split, "chunk": self._int("chunk"),
                     "images": self._int("images")}
        try:
            if policy == "explicit" and not split:
                raise E.ConfigError("split points: the explicit policy needs them (or choose equal or balanced)")
            if split and policy != "explicit":  # typed, then the policy changed: say so rather than drop them
                raise E.ConfigError(f"split points are used by the explicit policy, not {policy}: choose explicit, "
                                    "or clear them")
            options = resolve_options(profile, {**overrides, "split": split or None}, source="run form",
                                      name_of=lambda name: name.replace("_", " "))
            if profile is None and overrides["stages"] is None:
                options = options.model_copy(update={"stages": 2})
        except (E.PictlError, ValueError) as exc:
            self.show_error(exc)
            return
        self.dismiss((options, profile))
