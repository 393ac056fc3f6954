"""What every form shares: Enter in a field, ctrl+s anywhere, or the first button submits; Escape or Cancel
closes; the first text field has the focus (Enter on a list would open it), and the title says the keys."""

from __future__ import annotations

from typing import Generic, TypeVar

from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from pictl.text import markup_safe

Result = TypeVar("Result")


class FormScreen(ModalScreen[Result], Generic[Result]):
    """Subclasses compose their fields (with a `#form-error` label and a `#start` button) and `_submit`."""

    BINDINGS = [("escape", "cancel", "cancel"), ("ctrl+s", "submit", "start")]
    KEYS = "Enter or ctrl+s: start, Esc: cancel"

    def on_mount(self) -> None:
        field = self.query(Input).first() if self.query(Input) else None
        if field is not None:
            field.focus()
        titles = self.query(".form-title")
        if titles:
            title = titles.first(Label)
            title.update(f"{title.content}  [dim]({self.KEYS})[/]")

    def action_submit(self) -> None:
        self._submit()

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
