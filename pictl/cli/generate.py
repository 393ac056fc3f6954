"""`pictl generate`: greedy decoding of a decoder-only language model, pipelined over the inventory's hosts and
checked token for token against the serial run on one host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, get_args

import typer

from pictl.cli.common import (
    MODEL_PANEL,
    ColdOpt,
    HeadlessOpt,
    HostsOpt,
    JobDirOpt,
    JsonOpt,
    RunsDirOpt,
    VerboseOpt,
    WaitOpt,
    app,
    before_runs_dir,
    checked_runs_root,
    choices,
    flag_names,
    read_cluster,
    run_job,
)
from pictl.jobs.generation.options import SIZES
from pictl.jobs.generation.options import Arch as ArchLiteral

DECODE_PANEL = "Decoding"
if TYPE_CHECKING:
    from enum import StrEnum

    class Arch(StrEnum): ...

    class Size(StrEnum): ...

    class Policy(StrEnum): ...

    class Numerics(StrEnum): ...
else:
    Arch = choices("Arch", get_args(ArchLiteral))
    Size = choices("Size", tuple(SIZES))
    Policy = choices("GeneratePolicy", ("equal", "balanced"))
    Numerics = choices("GenerateNumerics", ("fp32", "int8-dynamic"))


def _cuts(value: str | None) -> list[int] | None:
    if value is None:
        return None
    from pictl import errors as E

    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise E.ConfigError(f"--split {value}: the first decoder layer of stages 2..N, e.g. 8,16") from None


@app.command()
def generate(
    model: Annotated[Optional[str], typer.Option(help="Model directory on the hosts (config.json and safetensors, "
                                                      "as save_pretrained writes). \\[default: built from --arch]",
                                                 rich_help_panel=MODEL_PANEL)] = None,
    arch: Annotated[Optional[Arch], typer.Option(help="Architecture to build with seeded random weights. "
                                                      "\\[default: llama]", rich_help_panel=MODEL_PANEL)] = None,
    size: Annotated[Optional[Size], typer.Option(help="Its sizes (qwen2.5-0.5b: Qwen2.5-0.5B's configuration). "
                                                      "\\[default: tiny]", rich_help_panel=MODEL_PANEL)] = None,
    layers: Annotated[Optional[int], typer.Option(help="Decoder layers, over the size's.",
                                                  rich_help_panel=MODEL_PANEL)] = None,
    stages: Annotated[Optional[int], typer.Option(help="Pipeline stages, one per host while they last. "
                                                       "\\[default: 2]", rich_help_panel=DECODE_PANEL)] = None,
    split: Annotated[Optional[str], typer.Option(
        help="First decoder layer of stages 2..N, e.g. 8,16. \\[default: layers shared out evenly]",
        rich_help_panel=DECODE_PANEL)] = None,
    policy: Annotated[Optional[Policy], typer.Option(
        help="Without --split: equal layers per stage, or balanced weights read per token (the head counts). "
             "\\[default: balanced]", rich_help_panel=DECODE_PANEL)] = None,
    sequences: Annotated[Optional[int], typer.Option(
        help="Sequences in flight (at least --stages keeps every stage busy). \\[default: 4]",
        rich_help_panel=DECODE_PANEL)] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help="New tokens per sequence. \\[default: 16]",
                                                      rich_help_panel=DECODE_PANEL)] = None,
    prompt_tokens: Annotated[Optional[int], typer.Option(help="Synthetic prompt length in tokens. \\[default: 8]",
                                                         rich_help_panel=DECODE_PANEL)] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="JSON file of prompts as token-id lists, one per sequence.",
                                                    rich_help_panel=DECODE_PANEL)] = None,
    numerics: Annotated[Optional[Numerics], typer.Option(
        help="int8-dynamic: int8 Linear layers, a bounded loss measured against an fp32 serial run. \\[default: fp32]",
        rich_help_panel=DECODE_PANEL)] = None,
    warmup_tokens: Annotated[Optional[int], typer.Option(help="Untimed tokens per sequence first. \\[default: 2]",
                                                         rich_help_panel=DECODE_PANEL)] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank. \\[default: 1]",
                                                   rich_help_panel=DECODE_PANEL)] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the weights and the synthetic prompts. \\[default: 0]",
                                                rich_help_panel=MODEL_PANEL)] = None,
    hosts: HostsOpt = None,
    wait: WaitOpt = False,
    cold: ColdOpt = False,
    runs_dir: RunsDirOpt = None,
    out: JobDirOpt = None,
    headless: HeadlessOpt = False,
    verbose: VerboseOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate text across the hosts: tokens per second against one host, the same token ids, where the time goes."""
    from pictl.headless import HeadlessRenderer
    from pictl.jobs.generation.options import generate_options, read_prompts
    from pictl.jobs.generation.session import GenerateSession

    del headless  # (the only way this command runs: the dashboard does not start generation jobs yet)
    renderer = HeadlessRenderer(verbose=verbose)

    def job() -> GenerateSession:
        given = {"model": model, "arch": arch, "size": size, "layers": layers, "stages": stages,
                 "split": _cuts(split), "policy": policy, "sequences": sequences, "new_tokens": new_tokens,
                 "prompt_tokens": prompt_tokens, "prompts": read_prompts(prompts) if prompts else None,
                 "numerics": numerics, "warmup_tokens": warmup_tokens, "threads": threads, "seed": seed}
        options = generate_options(given, name_of=flag_names())
        if out is not None:
            from pictl.records.runs import writable_dir

            writable_dir(out, "--out")
        root = out or (checked_runs_root(runs_dir).parent / "generations" if runs_dir or before_runs_dir() else None)
        return GenerateSession(read_cluster(hosts, cold=cold), options, on_event=renderer, root=root, wait=wait)

    run_job(job, renderer, as_json=as_json)
