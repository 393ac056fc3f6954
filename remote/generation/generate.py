"""Generation entry point: greedy decoding of several sequences, alone (the serial run) or as a pipeline of
consecutive decoder layers, one stage per rank under torchrun.

    python -m remote.generation.generate --spec spec.json                 (the serial run: every layer here)
    torchrun ... -m remote.generation.generate --spec spec.json           (one stage per rank)

Every rank takes the steps in one order: for each new token, each sequence in turn (its prompt first, then one
token). The first stage embeds the step's input and sends hidden states on; the last stage picks the next token
and sends its id back to the first stage, which feeds it in on the sequence's next turn. With at least as many
sequences as stages, every stage has a sequence to work on while the others' tokens travel. Each stage keeps the
KV cache of its own layers, per sequence.

A warm-up pass (a few tokens per sequence, caches thrown away) comes first; then the timed pass, whose token ids
and arrival times the first stage writes to `tokens_file`, and each stage reports where its time went (`gen_end`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.job_records import GenEnd, GenStart
from remote.floor.spec import GenerateSpec
from remote.generation.decoder import DecoderStage, build_stage
from remote.toolkit.measure import current_rss_mb, die_with_parent, peak_rss_mb, run_main, set_threads


@dataclass
class Clock:
    """Where one stage's time went over a pass."""

    compute_s: float = 0.0
    wait_s: float = 0.0
    send_s: float = 0.0
    bytes_sent: int = 0
    steps: int = 0


@dataclass
class Produced:
    """The first stage's view of the pass: each sequence's new token ids and when each arrived (seconds after the
    pass began)."""

    tokens: list[list[int]] = field(default_factory=list)
    arrivals: list[list[float]] = field(default_factory=list)


class Links:
    """Point-to-point sends and receives between neighbouring stages (and last -> first for token ids)."""

    def __init__(self, stage: int, stages: int, clock: Clock) -> None:
        self.stage, self.stages, self.clock = stage, stages, clock
        self._pending: list[dist.Work] = []

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        t0 = time.perf_counter()
        self._pending.append(dist.isend(tensor, dst))
        # Never wait on a send here: gloo completes one only once its receiver posts the matching receive, and with
        # more sequences than a bounded window the stage after us may be waiting on us for a token (a cycle: 18
        # sequences on 2 stages deadlocked behind a window of 8). The sends already delivered are let go.
        self._pending = [work for work in self._pending if not work.is_completed()]
        self.clock.send_s += time.perf_counter() - t0
        self.clock.bytes_sent += tensor.numel() * tensor.element_size()

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype)
        t0 = time.perf_counter()
        dist.recv(buffer, src)
        self.clock.wait_s += time.perf_counter() - t0
        return buffer

    def drain(self) -> None:
        t0 = time.perf_counter()
        for work in self._pending:
            work.wait()
        self._pending.clear()
        self.clock.send_s += time.perf_counter() - t0


def _pass(stage: DecoderStage, index: int, stages: int, prompts: list[list[int]], new_tokens: int,
          hidden_size: int, clock: Clock) -> Produced:
    """One pass over every sequence for `new_tokens` tokens each, from fresh caches."""
    caches = [stage.new_cache() for _ in prompts]
    produced = Produced([[] for _ in prompts], [[] for _ in prompts])
    links = Links(index, stages, clock) if stages > 1 else None
    last_rank = stages - 1
    started = time.perf_counter()
    for step in range(new_tokens):
        for seq, prompt in enumerate(prompts):
            width = len(prompt) if step == 0 else 1
            if stage.first:
                if step == 0:
                    x = torch.tensor([prompt], dtype=torch.long)
                elif links is None:
                    x = torch.tensor([[produced.tokens[seq][-1]]], dtype=torch.long)
                else:
                    x = links.recv((1,), torch.long, last_rank).reshape(1, 1)
                    _arrived(produced, seq, int(x), started)
            else:
                assert links is not None
                x = links.recv((1, width, hidden_size), torch.float32, index - 1)
            t0 = time.perf_counter()
            y = stage.step(x, caches[seq])
            clock.compute_s += time.perf_counter() - t0
            clock.steps += 1
            if links is None:  # one stage: the token is here already
                _arrived(produced, seq, int(y), started)
            elif stage.last:
                links.send(y, 0)
            else:
                links.send(y, index + 1)
    if links is not None:
        if stage.first:  # the last step's tokens: produced, sent back, not fed on
            for seq in range(len(prompts)):
                _arrived(produced, seq, int(links.recv((1,), torch.long, last_rank)), started)
        links.drain()
    return produced


def _arrived(produced: Produced, seq: int, token: int, started: float) -> None:
    produced.tokens[seq].append(token)
    produced.arrivals[seq].append(round(time.perf_counter() - started, 6))


def _generate(spec: GenerateSpec, emitter: Emitter) -> None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    die_with_parent()
    set_threads(spec.threads)
    if len(spec.split) != world - 1:
        raise BadInput(f"{world} stage(s) need {world - 1} cut(s); the spec gives {len(spec.split)}")
    if not spec.prompts or any(not p for p in spec.prompts):
        raise BadInput("every sequence needs a prompt of at least one token")
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=spec.pg_timeout_s))
    t0 = time.perf_counter()
    stage = build_stage(spec, rank, world)
    vocab = int(stage.config.vocab_size)
    bad = [t for p in spec.prompts for t in p if not 0 <= t < vocab]
    if bad:
        raise BadInput(f"prompt token id {bad[0]} is outside the model's vocabulary (0..{vocab - 1})")
    import transformers

    emitter.emit(GenStart(stage=rank, stages=world, first_layer=stage.first_layer, end_layer=stage.end_layer,
                          layers=int(stage.config.num_hidden_layers), params=stage.params,
                          load_s=round(time.perf_counter() - t0, 3), rss_mb=current_rss_mb(),
                          arch=str(stage.config.model_type), numerics=spec.numerics, engine=stage.engine,
                          torch=torch.__version__,
                          transformers=transformers.__version__))
    hidden = int(stage.config.hidden_size)
    if spec.warmup_tokens:
        _pass(stage, rank, world, spec.prompts, spec.warmup_tokens, hidden, Clock())
    if world > 1:
        dist.barrier()  # every stage starts the timed pass together
    clock = Clock()
    started = time.perf_counter()
    produced = _pass(stage, rank, world, spec.prompts, spec.new_tokens, hidden, clock)
    seconds = time.perf_counter() - started
    tokens_file = None
    if stage.first:
        tmp = Path(f".{spec.tokens_file}.tmp")
        tmp.write_text(json.dumps({"tokens": produced.tokens, "arrivals_s": produced.arrivals}))
        os.replace(tmp, spec.tokens_file)
        tokens_file = spec.tokens_file
    emitter.emit(GenEnd(stage=rank, tokens=clock.steps, seconds=round(seconds, 6),
                        compute_s=round(clock.compute_s, 6), wait_s=round(clock.wait_s, 6),
                        send_s=round(clock.send_s, 6), bytes_sent=clock.bytes_sent, peak_rss_mb=peak_rss_mb(),
                        tokens_file=tokens_file))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_GENERATE, rank=int(os.environ.get("RANK", "0")))
    return run_main(emitter, lambda: _generate(GenerateSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
