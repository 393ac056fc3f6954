"""The form that starts a pruning job: model, data, ratio, importance, fine-tuning, where it runs."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select

from pictl import errors as E
from pictl.inventory import Cluster
from pictl.jobs.prune_options import PruneOptions, parse_model_args, prune_options
from pictl.tui.widgets.form_screen import FormScreen

CONTROLLER = "here (the controller)"


class PruneForm(FormScreen[tuple[PruneOptions, str | None] | None]):
    """Dismisses with (options, host name or None for the controller) once they validate."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster

    def compose(self) -> ComposeResult:
        defaults = PruneOptions.model_fields
        with Vertical(id="prune-form"):
            yield Label("Prune a model (torch-pruning), fine-tune it, write an artifact", classes="form-title")
            yield Label("model (timm name) and its arguments, e.g. depth=6,img_size=32")
            with Horizontal(classes="pair"):
                yield Input(defaults["model"].default, id="model")
                yield Input("", placeholder="none", id="model-args")
            yield Label("base weights (.safetensors / .pth; empty: seeded random weights)")
            yield Input("", id="checkpoint")
            yield Label("data set and its directory (train/ and test/ for an ImageFolder)")
            with Horizontal(classes="pair"):
                yield Select([(k, k) for k in ("cifar10", "cifar100", "imagefolder")], value="cifar10", id="data",
                             allow_blank=False)
                yield Input("", placeholder="directory", id="data-path")
            yield Label("ratio, importance")
            with Horizontal(classes="pair"):
                yield Input(str(defaults["ratio"].default), id="ratio", type="number")
                yield Select([(k, k) for k in ("hessian", "taylor", "l1", "l2")], value="hessian", id="importance",
                             allow_blank=False)
            yield Checkbox("global pruning (rank channels across layers)", id="global")
            yield Label("fine-tuning epochs, learning rate")
            with Horizontal(classes="pair"):
                yield Input(str(defaults["epochs"].default), id="epochs", type="integer")
                yield Input(str(defaults["lr"].default), id="lr", type="number")
            yield Label("run it on")
            yield Select([(CONTROLLER, "")] + [(h.name, h.name) for h in self.cluster.hosts], value="", id="on",
                         allow_blank=False)
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Prune", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _text(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value.strip()

    def _submit(self) -> None:
        try:
            options = prune_options({
                "model": self._text("model"), "model_args": parse_model_args(self._text("model-args").split(",")),
                "checkpoint": self._text("checkpoint") or None, "data": self.query_one("#data", Select).value,
                "data_path": self._text("data-path") or None, "ratio": self._text("ratio") or None,
                "importance": self.query_one("#importance", Select).value,
                "global_pruning": self.query_one("#global", Checkbox).value,
                "epochs": self._text("epochs") or None, "lr": self._text("lr") or None})
        except (E.PictlError, ValueError) as exc:
            self.show_error(exc)
            return
        on = str(self.query_one("#on", Select).value) or None
        self.dismiss((options, on))
