"""Encoding a stage's outgoing activations for the wire, and decoding them on the next stage.

The sending stage encodes inside its forward, the receiving one decodes inside its own, so the pipeline
schedule and gloo only ever see ordinary tensors (of other dtypes and shapes). Every tensor of the state
is encoded, the residual of an in-block cut included. Formats and their sizes: `remote.floor.wire`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from remote.floor.wire import WireFormat
from remote.toolkit.feedback import DeltaMemory

POWER_ITERATIONS = 2
"""Power-iteration steps of `lowrank:R` (PowerSGD uses 1 per step with warm starts; a cold start needs 2)."""


def _matrix(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """The shape lowrank factors: a ViT's (B, T, C) as it is; a CNN's feature map (B, C, H, W) as (B, C, H*W),
    the channels against the positions (as the two-machine experiment compresses it)."""
    return (*shape[:-2], shape[-2] * shape[-1]) if len(shape) == 4 else tuple(shape)


def _rank(fmt: WireFormat, shape: torch.Size | tuple[int, ...]) -> int:
    matrix = _matrix(shape)
    return min(fmt.rank, matrix[-2], matrix[-1])


def payload_meta(fmt: WireFormat, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Meta tensors of what goes on the wire for fp32 tensors of `shapes` (PipelineStage's input/output args)."""
    out = []
    for shape in shapes:
        if fmt.kind == "fp32":
            out.append(torch.empty(shape, device="meta"))
        elif fmt.kind in ("fp16", "bf16"):
            out.append(torch.empty(shape, device="meta", dtype=getattr(torch, {"fp16": "float16",
                                                                                 "bf16": "bfloat16"}[fmt.kind])))
        elif fmt.kind == "int8":
            out += [torch.empty((*shape[:-1], -(-shape[-1] // 4)), device="meta"),
                    torch.empty((*shape[:-1], 1), device="meta")]
        elif fmt.kind == "convinsert":
            out.append(torch.empty(_squeezed(fmt, shape), device="meta"))
        else:
            r, m = _rank(fmt, shape), _matrix(shape)
            out += [torch.empty((*m[:-1], r), device="meta"), torch.empty((*m[:-2], m[-1], r), device="meta")]
    return out


def _squeezed(fmt: WireFormat, shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """What convinsert's compressor makes of a state of `shape`: a ViT's (B, T, C) as (B, T, k), a CNN's
    (B, C, H, W) as (B, k, H // 2, W // 2) (a 2x2 convolution of stride 2)."""
    if len(shape) == 4:
        return (shape[0], max(1, round(4 * shape[1] * fmt.rate)), shape[2] // 2, shape[3] // 2)
    return (*shape[:-1], max(1, round(shape[-1] * fmt.rate)))


def learned_pair(fmt: WireFormat, shapes: list[torch.Size], seed: int) -> tuple[nn.ModuleList, nn.ModuleList]:
    """convinsert's compressors (the sending stage's) and decompressors (the receiving stage's), one per state
    tensor of `shapes` (per image); each side builds only the half it runs, from its own seed."""
    encoders, decoders = nn.ModuleList(), nn.ModuleList()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for shape in shapes:
            k = _squeezed(fmt, shape)[1 if len(shape) == 4 else -1]
            if len(shape) == 4:
                encoders.append(nn.Conv2d(shape[1], k, 2, stride=2))
                decoders.append(nn.ConvTranspose2d(k, shape[1], 2, stride=2))
            else:
                encoders.append(nn.Linear(shape[-1], k))
                decoders.append(nn.Linear(k, shape[-1]))
    return encoders, decoders


def _int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp32 scale per row (a token, or a feature map's row): its largest |value| / 127."""
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 127.0
    return torch.round(t.float() / scale).clamp_(-127, 127).to(torch.int8), scale


def _carried(q: torch.Tensor) -> torch.Tensor:
    """int8 values (..., C) as the bytes of an fp32 tensor (..., ceil(C / 4)): what crosses the link.

    Why fp32: the pipeline schedule sends a gradient back only for a floating-point input it received, so
    an int8 tensor would cut the backward pass. Carried as fp32 bytes (never computed with), the values
    go forward and the int8 gradient comes back in the same slot, at the same 1 byte a value.
    """
    pad = -q.shape[-1] % 4
    return (F.pad(q, (0, pad)) if pad else q).contiguous().view(torch.float32)


def _uncarried(carrier: torch.Tensor, width: int) -> torch.Tensor:
    return carrier.contiguous().view(torch.int8)[..., :width]


class _Int8Send(torch.autograd.Function):
    """The sending side: forward, the state as int8 and its scales; backward, the int8 gradient (that the
    receiving side put in the values' slot, its scales in the scales' slot) back to fp32."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]  # noqa: ANN001
        ctx.width = t.shape[-1]
        q, scale = _int8(t)
        return _carried(q), scale

    @staticmethod
    def backward(ctx, carried: torch.Tensor | None, scale: torch.Tensor | None,  # type: ignore[override]  # noqa: ANN001
                 ) -> torch.Tensor | None:
        if carried is None or scale is None:
            return None
        return _uncarried(carried, ctx.width).float() * scale


class _Int8Receive(torch.autograd.Function):
    """The receiving side: forward, the values times their scales; backward, the gradient quantised the same
    way (per row, its own scales), in the slots the values and scales came in."""

    @staticmethod
    def forward(ctx, carried: torch.Tensor, scale: torch.Tensor, width: int,  # type: ignore[override]  # noqa: ANN001
                ) -> torch.Tensor:
        return _uncarried(carried, width).float() * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]  # noqa: ANN001
        q, scale = _int8(grad)
        return _carried(q), scale, None


def _lowrank(x: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., T, C) ~ p @ q^T with p (..., T, r) orthonormal and q (..., C, r): power iteration from a fixed
    start, so that every run (and the serial comparison) sees the same factors for the same input."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((x.shape[-1], rank), generator=gen, dtype=x.dtype).expand(*x.shape[:-2], -1, -1)
    with torch.no_grad():  # the basis is found, not learned: training differentiates through q alone
        for _ in range(POWER_ITERATIONS):
            p = torch.linalg.qr(x @ q).Q
            q = x.transpose(-2, -1) @ p
    # Recomputed with the gradient (the same numbers): in training, x ~ p p^T x, so the gradient that comes
    # back is projected on the same basis, and q's gradient (C x r) is what crosses the link.
    q = x.transpose(-2, -1) @ p
    return p.contiguous(), q.contiguous()


def encode(fmt: WireFormat, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    out: list[torch.Tensor] = []
    for t in state:
        if fmt.kind == "fp32":
            out.append(t)
        elif fmt.kind == "fp16":
            out.append(t.to(torch.float16))
        elif fmt.kind == "bf16":
            out.append(t.to(torch.bfloat16))
        elif fmt.kind == "int8":
            out += list(_Int8Send.apply(t))
        else:
            out += list(_lowrank(t.reshape(_matrix(t.shape)), _rank(fmt, t.shape)))
    return tuple(out)


def decode(fmt: WireFormat, payload: tuple[torch.Tensor, ...],
           shapes: list[torch.Size] | None = None) -> tuple[torch.Tensor, ...]:
    """The state from its payload; `shapes` (the state's, per microbatch) restore a feature map's H and W."""
    if fmt.kind == "fp32":
        return payload
    if fmt.kind in ("fp16", "bf16"):
        return tuple(t.to(torch.float32) for t in payload)
    pairs = zip(payload[::2], payload[1::2], strict=True)
    if fmt.kind == "int8":  # without `shapes`, every row's width is a multiple of 4 (a ViT's)
        return tuple(_Int8Receive.apply(q, scale, shapes[i][-1] if shapes is not None else 4 * q.shape[-1])
                     for i, (q, scale) in enumerate(pairs))
    out = []
    for i, (p, q) in enumerate(pairs):
        x = p @ q.transpose(-2, -1)
        if shapes is not None and len(shapes[i]) == 4:
            x = x.reshape(*x.shape[:-1], *shapes[i][-2:])
        out.append(x)
    return tuple(out)


@dataclass
class CodecCounters:
    """What compression cost and saved on one stage (added into the stage's counters every microbatch)."""

    raw_bytes: int = 0
    compress_s: float = 0.0
    decompress_s: float = 0.0


class Codec:
    """A stage's two ends: decode what arrives (`fmt_in`), encode what leaves (`fmt_out`); None: not a cut."""

    def __init__(self, fmt_in: WireFormat | None, fmt_out: WireFormat | None,
                 in_shapes: list[torch.Size] | None = None, *, encoders: nn.ModuleList | None = None,
                 decoders: nn.ModuleList | None = None, feedback: bool = False) -> None:
        self.fmt_in, self.fmt_out = fmt_in, fmt_out
        self.in_shapes = in_shapes
        """The state's shapes as it arrives (a CNN's feature maps: lowrank restores their H and W)."""
        self.encoders, self.decoders = encoders, decoders
        """convinsert: the learned halves this stage runs (the stage module holds them as its own layers)."""
        self.received = DeltaMemory() if feedback and fmt_in is not None and fmt_in.kind == "lowrank" else None
        self.sent = DeltaMemory() if feedback and fmt_out is not None and fmt_out.kind == "lowrank" else None
        """Training's error feedback at a lowrank cut (`remote.toolkit.feedback`): each end's per-image copy."""
        self.counters = CodecCounters()

    def expect(self, micro: list[list[int]]) -> None:
        """A training step's images per microbatch, for the error feedback's per-image copies."""
        for memory in (self.received, self.sent):
            if memory is not None:
                memory.expect(micro)

    def take(self) -> CodecCounters:
        taken, self.counters = self.counters, CodecCounters()
        return taken

    def decode(self, payload: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.fmt_in is None or self.fmt_in.lossless:
            return payload
        start = time.perf_counter()
        if self.fmt_in.kind == "convinsert":
            assert self.decoders is not None and self.in_shapes is not None
            state = tuple(dec(t, output_size=shape[-2:]) if isinstance(dec, nn.ConvTranspose2d) else dec(t)
                          for dec, t, shape in zip(self.decoders, payload, self.in_shapes, strict=True))
            self.counters.decompress_s += time.perf_counter() - start
            return state
        images = self.received.next_images() if self.received is not None else None
        state = decode(self.fmt_in, payload, self.in_shapes)
        if self.received is not None and images is not None:  # what came is the change since the kept copy
            state = tuple(b + s for b, s in zip(self.received.base(images, state), state, strict=True))
            self.received.keep(images, state)
        self.counters.decompress_s += time.perf_counter() - start
        return state

    def encode(self, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.fmt_out is None:
            return state
        self.counters.raw_bytes += sum(t.numel() * t.element_size() for t in state)
        if self.fmt_out.lossless:
            return state
        start = time.perf_counter()
        if self.fmt_out.kind == "convinsert":
            assert self.encoders is not None
            payload = tuple(enc(t) for enc, t in zip(self.encoders, state, strict=True))
            self.counters.compress_s += time.perf_counter() - start
            return payload
        images = self.sent.next_images() if self.sent is not None else None
        if self.sent is not None and images is not None:  # send the change since the receiver's copy
            base = self.sent.base(images, state)
            payload = encode(self.fmt_out, tuple(t - b for t, b in zip(state, base, strict=True)))
            with torch.no_grad():  # what the receiver rebuilds from it, bit for bit
                change = decode(self.fmt_out, tuple(t.detach() for t in payload), [t.shape for t in state])
            self.sent.keep(images, tuple(b + c for b, c in zip(base, change, strict=True)))
        else:
            payload = encode(self.fmt_out, state)
        self.counters.compress_s += time.perf_counter() - start
        return payload
