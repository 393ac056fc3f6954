"""`pictl train`: training across the inventory's hosts, single, pipeline-parallel or data-parallel."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Optional, get_args

import typer

from pictl.cli.common import (
    MODEL_PANEL,
    DataPathOpt,
    JobDirOpt,
    app,
    before_runs_dir,
    checked_runs_root,
    choices,
    flag_names,
    read_cluster,
    run_job,
    tracked,
)
from pictl.cli.option_groups import HostFlags, OptionGroup, OutputFlags, grouped
from pictl.jobs.training.options import Mode as ModeLiteral
from pictl.jobs.training.options import Schedule as ScheduleLiteral
from pictl.jobs.training.options import TrainData, TrainPolicy

STEP_PANEL = "Steps and schedule"
if TYPE_CHECKING:  # to mypy, str Enums; built from the options' Literals so the two cannot drift apart
    class Mode(StrEnum): ...

    class Schedule(StrEnum): ...

    class Data(StrEnum): ...

    class Optim(StrEnum): ...

    class TrainPolicyChoice(StrEnum): ...
else:
    Mode = choices("Mode", get_args(ModeLiteral))
    Schedule = choices("Schedule", get_args(ScheduleLiteral))
    Data = choices("TrainData", get_args(TrainData))
    Optim = choices("Optimizer", ("sgd", "adamw"))
    TrainPolicyChoice = choices("TrainPolicyChoice", get_args(TrainPolicy))


@dataclasses.dataclass(frozen=True)
class StepFlags(OptionGroup):
    """How training runs: the mode and schedule, the steps and their optimizer, what crosses a cut."""

    mode: Annotated[Optional[Mode], typer.Option(help="single (one host), pipeline (stages over hosts) or ddp "
                                                      "(a replica per host). \\[default: pipeline]",
                                                 rich_help_panel=STEP_PANEL)] = None
    schedule: Annotated[Optional[Schedule], typer.Option(help="Pipeline schedule. \\[default: gpipe]",
                                                         rich_help_panel=STEP_PANEL)] = None
    stages: Annotated[Optional[int], typer.Option(help="Pipeline stages, or ddp ranks. \\[default: 2]",
                                                  rich_help_panel=STEP_PANEL)] = None
    policy: Annotated[Optional[TrainPolicyChoice], typer.Option(
        help="How a pipeline is split without --split: equal parameters, or balanced over the hosts' measured "
             "costs (forward and backward). \\[default: equal]", rich_help_panel=STEP_PANEL)] = None
    split: Annotated[Optional[str], typer.Option(help="Where stages 2..N begin (pipeline), e.g. blocks.6.",
                                                 rich_help_panel=STEP_PANEL)] = None
    batch_size: Annotated[Optional[int], typer.Option(help="Global batch per step, in every mode. \\[default: 8]",
                                                      rich_help_panel=STEP_PANEL)] = None
    chunks: Annotated[Optional[int], typer.Option(help="Microbatches per step (divides the batch). \\[default: 4]",
                                                  rich_help_panel=STEP_PANEL)] = None
    steps: Annotated[Optional[int], typer.Option(help="Optimizer steps (0: --epochs over the training images).",
                                                 rich_help_panel=STEP_PANEL)] = None
    epochs: Annotated[Optional[int], typer.Option(help="Epochs when --steps is 0. \\[default: 1]",
                                                  rich_help_panel=STEP_PANEL)] = None
    warmup_steps: Annotated[Optional[int], typer.Option(help="Steps left out of samples/s. \\[default: 1]",
                                                        rich_help_panel=STEP_PANEL)] = None
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (cosine over all steps). \\[default: 0.01]",
                                                rich_help_panel=STEP_PANEL)] = None
    optimizer: Annotated[Optional[Optim], typer.Option(help="\\[default: sgd (momentum 0.9)]",
                                                       rich_help_panel=STEP_PANEL)] = None
    amp: Annotated[Optional[bool], typer.Option("--amp/--fp32", help="bf16 autocast on the CPU. \\[default: fp32]",
                                                rich_help_panel=STEP_PANEL)] = None
    check_steps: Annotated[Optional[int], typer.Option(help="Steps whose loss must match a single run's "
                                                            "(0: no check). \\[default: 3]",
                                                       rich_help_panel=STEP_PANEL)] = None
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank. \\[default: 1]",
                                                   rich_help_panel=STEP_PANEL)] = None
    workers: Annotated[Optional[int], typer.Option(help="Data-loading processes per rank that reads images "
                                                        "(0: the step reads them). \\[default: 0]",
                                                   rich_help_panel=STEP_PANEL)] = None
    wire: Annotated[Optional[str], typer.Option(help="Pipeline: what crosses each cut, activations forward and "
                                                     "gradients back: fp32, fp16, bf16, int8, lowrank:R, "
                                                     "convinsert:RATE (per cut: "
                                                     "blocks.6=fp16). \\[default: fp32]",
                                                rich_help_panel=STEP_PANEL)] = None
    keep_compressor: Annotated[Optional[bool], typer.Option(
        "--keep-compressor/--drop-compressor", help="convinsert: keep the learned pairs in the merged model (a "
        "pipelined deployment cut there sends the code). \\[default: drop]", rich_help_panel=STEP_PANEL)] = None
    error_feedback: Annotated[Optional[bool], typer.Option(
        "--error-feedback/--no-error-feedback", help="lowrank cuts: send each image's change since the "
        "receiver's copy of it (costs a state per training image on each side). \\[default: on]",
        rich_help_panel=STEP_PANEL)] = None
    checkpoint_activations: Annotated[Optional[bool], typer.Option(
        "--checkpoint-activations/--keep-activations", help="Recompute activations in the backward pass "
        "(less memory, more compute; per stage). \\[default: keep]", rich_help_panel=STEP_PANEL)] = None
    lora: Annotated[Optional[int], typer.Option(
        help="Fine-tune rank-R LoRA adapters (peft) on the attention projections, the rest frozen but the head; "
             "the merged model is written. \\[default: 0, every weight]", rich_help_panel=STEP_PANEL)] = None


@dataclasses.dataclass(frozen=True)
class TrainModelFlags(OptionGroup):
    """What is trained on what: the model, its starting weights, the images, and whether it is saved."""

    model: Annotated[Optional[str], typer.Option(help="timm ViT, ResNet or MobileNet/EfficientNet. "
                                                      "\\[default: deit_small_patch16_224]",
                                                 rich_help_panel=MODEL_PANEL)] = None
    model_arg: Annotated[Optional[list[str]], typer.Option(help="timm constructor argument KEY=VALUE.",
                                                           rich_help_panel=MODEL_PANEL)] = None
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs (default: the data set's).",
                                                       rich_help_panel=MODEL_PANEL)] = None
    image_size: Annotated[Optional[int], typer.Option(help="Input side in pixels (default: the model's).",
                                                      rich_help_panel=MODEL_PANEL)] = None
    checkpoint: Annotated[Optional[str], typer.Option(help="Starting weights on the hosts (default: seeded random).",
                                                      rich_help_panel=MODEL_PANEL)] = None
    allow_pickle: Annotated[bool, typer.Option("--allow-pickle", help="Allow a pickled checkpoint.",
                                               rich_help_panel=MODEL_PANEL)] = False
    data: Annotated[Optional[Data], typer.Option(help="\\[default: synthetic]", rich_help_panel=MODEL_PANEL)] = None
    data_path: DataPathOpt = None
    train_images: Annotated[Optional[int], typer.Option(help="Training images. \\[default: 256]",
                                                        rich_help_panel=MODEL_PANEL)] = None
    eval_images: Annotated[Optional[int], typer.Option(help="Held-out images for top-1 (0: none). \\[default: 64]",
                                                       rich_help_panel=MODEL_PANEL)] = None
    seed: Annotated[Optional[int], typer.Option(help="Seed for weights and data order. \\[default: 0]",
                                                rich_help_panel=MODEL_PANEL)] = None
    save: Annotated[Optional[bool], typer.Option("--save/--no-save", help="Assemble the trained model. "
                                                 "\\[default: save]", rich_help_panel=MODEL_PANEL)] = None


@app.command()
@grouped
def train(
    training: StepFlags,
    model_data: TrainModelFlags,
    break_rank: Annotated[Optional[int], typer.Option(hidden=True)] = None,
    out: JobDirOpt = None,
    *,
    where: HostFlags,
    output: OutputFlags,
) -> None:
    """Train across the hosts: the loss of every mode checked against a single run's, time per category per rank."""
    from pictl.headless import HeadlessRenderer
    from pictl.jobs.prune_options import parse_model_args
    from pictl.jobs.training.options import train_options
    from pictl.jobs.training.session import TrainSession
    from pictl.planning.options import parse_split

    renderer = HeadlessRenderer(verbose=output.verbose)

    def job() -> TrainSession:
        # Both groups' options are training options by their own names: split points and model arguments
        # parsed, an --allow-pickle not given left to the options' default.
        given = {**training.values(), **model_data.values()}
        given.update(split=parse_split(given["split"]), model_args=parse_model_args(given.pop("model_arg")),
                     allow_pickle=given["allow_pickle"] or None, break_rank=break_rank, track=tracked(output.track))
        options = train_options(given, name_of=flag_names(model_args="--model-arg"))
        if out is not None:
            from pictl.records.runs import writable_dir

            writable_dir(out, "--out")
        runs_dir = where.runs_dir
        root = out or (checked_runs_root(runs_dir).parent / "trains" if runs_dir or before_runs_dir() else None)
        return TrainSession(read_cluster(where.hosts, cold=where.cold), options, on_event=renderer, root=root,
                            wait=where.wait)

    run_job(job, renderer, as_json=output.as_json)
