"""What the run and sweep forms share: Enter or the first button submits, Escape or Cancel closes."""

from __future__ import annotations

from typing import Generic, TypeVar

from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from pictl.text import markup_safe

Result = TypeVar("Result")


class FormScreen(ModalScreen[Result], Generic[Result]):
    """Subclasses compose their fields (with a `#form-error` label and a `#start` button) and `_submit`."""

    BINDINGS = [("escape", "cancel", "cancel")]

    def _submit(self) -> None:
        raise NotImplementedError

    def show_error(self, message: object) -> None:
        self.query_one("#form-error", Label).update(f"[red]{markup_safe(message)}[/]")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self._submit()
        else:
            self.dismiss(None)

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self._submit()

    def action_cancel(self) -> None:
        self.dismiss(None)
