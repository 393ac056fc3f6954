"""What every form shares: ctrl+s anywhere or the first button submits; Enter in a field goes on to the next one,
as Tab does (an Enter meant to finish the stages field started the run); Escape or Cancel closes. The first
text field has the focus (Enter on a list would open it), and the keys are said in the title (pinned on top of a
form that scrolls) and in a footer at the foot of the screen: neither is ever scrolled out of view."""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label

from pictl.text import markup_safe

Result = TypeVar("Result")


class FormScreen(ModalScreen[Result], Generic[Result]):
    """Subclasses compose their fields (with a `#form-error` label and a `#start` button) and `_submit`."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel"),
                                             Binding("ctrl+s", "submit", "start", priority=True),
                                             Binding("enter", "enter_in_field", show=False, priority=True),
                                             Binding("tab", "next_field", show=False, priority=True),
                                             Binding("shift+tab", "previous_field", show=False, priority=True)]
    KEYS = "ctrl+s: start, Esc: cancel"

    def on_mount(self) -> None:
        field = self.query(Input).first() if self.query(Input) else None
        if field is not None:
            field.focus()
        titles = self.query(".form-title")
        if titles:
            title = titles.first(Label)
            title.update(f"{title.content}  [dim]({self.KEYS})[/]")
        self.mount(Footer(compact=True, show_command_palette=False))

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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Enter is the form's only in a text field; on a list or a button it is theirs (open, press).
        return isinstance(self.focused, Input) if action == "enter_in_field" else True

    # Enter and Tab move the focus here, as the key is read (priority bindings), not from the focused field's own
    # queue: keys typed ahead (a terminal under load delivers them in a burst) were handed to the field that had
    # the focus when they were read, before the Tab or Enter queued there had moved it (a test typed `2`, Enter,
    # three Tabs and `2`: the second 2 went to chunk, not images).
    def action_enter_in_field(self) -> None:
        self.focus_next()

    def action_next_field(self) -> None:
        self.focus_next()

    def action_previous_field(self) -> None:
        self.focus_previous()

    def action_cancel(self) -> None:
        self.dismiss(None)
