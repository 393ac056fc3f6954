"""The form that starts a training job: mode and schedule, ranks, model, batch as microbatches, steps, data."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Checkbox, Input, Label, Select

from pictl import errors as E
from pictl.jobs.prune_options import parse_model_args
from pictl.jobs.training.options import TrainOptions, train_options
from pictl.tui.widgets.form_screen import FormScreen


class TrainForm(FormScreen[tuple[TrainOptions] | None]):
    """Dismisses with the job's options once they validate (the same checks as `pictl train`)."""

    def compose(self) -> ComposeResult:
        d = TrainOptions.model_fields
        with VerticalScroll(id="train-form"):
            yield Label("Train across the hosts: every mode's loss is checked against a single run's",
                        classes="form-title")
            yield Label("mode, pipeline schedule")
            with Horizontal(classes="pair"):
                yield Select([(k, k) for k in ("pipeline", "ddp", "single")], value="pipeline", id="mode",
                             allow_blank=False)
                yield Select([(k, k) for k in ("gpipe", "1f1b")], value="gpipe", id="schedule", allow_blank=False)
            yield Label("ranks (pipeline stages or ddp replicas), steps (0: one epoch)")
            with Horizontal(classes="pair"):
                yield Input(str(d["stages"].default), id="stages", type="integer")
                yield Input(str(d["steps"].default), id="steps", type="integer")
            yield Label("model (timm name) and its arguments, e.g. depth=6,img_size=32")
            with Horizontal(classes="pair"):
                yield Input(d["model"].default, id="model")
                yield Input("", placeholder="none", id="model-args")
            yield Label("batch per step, chunks (microbatches; they divide the batch)")
            with Horizontal(classes="pair"):
                yield Input(str(d["batch_size"].default), id="batch-size", type="integer")
                yield Input(str(d["chunks"].default), id="chunks", type="integer")
            yield Label("data set and its directory on the hosts (none for synthetic)")
            with Horizontal(classes="pair"):
                yield Select([(k, k) for k in ("synthetic", "cifar10", "cifar100", "imagefolder")],
                             value="synthetic", id="data", allow_blank=False)
                yield Input("", placeholder="directory", id="data-path")
            yield Label("training images, learning rate")
            with Horizontal(classes="pair"):
                yield Input(str(d["train_images"].default), id="train-images", type="integer")
                yield Input(str(d["lr"].default), id="lr", type="number")
            yield Checkbox("bf16 autocast (--amp)", id="amp")
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Train", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _text(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value.strip()

    def _submit(self) -> None:
        try:
            options = train_options({
                "mode": self.query_one("#mode", Select).value, "schedule": self.query_one("#schedule", Select).value,
                "stages": self._text("stages") or None, "steps": self._text("steps") or None,
                "model": self._text("model") or None,
                "model_args": parse_model_args(self._text("model-args").split(",")),
                "batch_size": self._text("batch-size") or None, "chunks": self._text("chunks") or None,
                "data": self.query_one("#data", Select).value, "data_path": self._text("data-path") or None,
                "train_images": self._text("train-images") or None, "lr": self._text("lr") or None,
                "amp": self.query_one("#amp", Checkbox).value})
        except (E.PictlError, ValueError) as exc:
            self.show_error(exc)
            return
        self.dismiss((options,))
