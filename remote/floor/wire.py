"""What travels between pipeline stages: the wire formats, parsed and sized without torch.

`--wire` takes one format for every cut (`int8`), or per cut (`blocks.4=fp16,blocks.8=int8`; cuts not
named stay `fp32`), or both (`int8,blocks.4=fp16`). Formats:

- `fp32`: the activations as computed; exact (the default).
- `fp16`, `bf16`: half-width floats; half the bytes.
- `int8`: 8-bit integers with one fp32 scale per token (its largest |value| / 127), sent beside them;
  about a quarter of the bytes. In training the gradient comes back the same way (int8, a scale per row).
- `lowrank:R`: each image's tokens x channels matrix factored to rank R by power iteration (the related
  work's PowerSGD-style compression), the two factors sent in fp32: R (T + C) / (T C) of the bytes.
- `convinsert:RATE` (training only): a learned compressor before the cut and decompressor after it, trained
  with the model (a Linear to round(C x RATE) channels for a ViT's tokens; a stride-2 convolution to
  round(4 C x RATE) channels for a CNN's feature map): about RATE of the bytes.

The controller validates with this module; `remote.toolkit.codec` encodes and decodes with torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KINDS = ("fp32", "fp16", "bf16", "int8", "lowrank", "convinsert")
MAX_RANK = 256
# ASCII only: `\d`, `\w` and int() also take other scripts' digits (`lowrank:٣`, `lowrank:１２`), which a
# spec must not carry as a rank or a module name.
_LOWRANK = re.compile(r"lowrank:([0-9]{1,4})")
_CONVINSERT = re.compile(r"convinsert:([0-9]{1,2}(?:\.[0-9]{1,4})?|\.[0-9]{1,4})")
_CUT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class WireFormat:
    kind: str
    rank: int = 0
    rate: float = 0.0
    """convinsert: the share of the channels (a CNN's: of the values) the learned compressor keeps."""

    def __str__(self) -> str:
        if self.kind == "convinsert":
            return f"convinsert:{self.rate:g}"
        return f"lowrank:{self.rank}" if self.kind == "lowrank" else self.kind

    @property
    def learned(self) -> bool:
        """Has parameters, trained with the model: exists in training only."""
        return self.kind == "convinsert"

    @property
    def lossless(self) -> bool:
        return self.kind == "fp32"

    def payload_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes on the wire for one fp32 tensor of `shape` ((batch, tokens, channels) for a ViT state)."""
        n = math.prod(shape)
        if self.kind == "fp32":
            return 4 * n
        if self.kind in ("fp16", "bf16"):
            return 2 * n
        if self.kind == "int8":
            rows = math.prod(shape[:-1])  # the values (each row padded to 4 bytes), and one fp32 scale a row
            return rows * (4 * -(-shape[-1] // 4)) + 4 * rows
        if self.kind == "convinsert":
            return 4 * math.prod(shape[:-1]) * max(1, round(shape[-1] * self.rate))
        batch, channels = math.prod(shape[:-2]), shape[-1]
        tokens = shape[-2] if len(shape) >= 2 else 1
        rank = min(self.rank, tokens, channels)
        return 4 * batch * rank * (tokens + channels)


FP32 = WireFormat("fp32")
VIT_S_STATE = (1, 197, 384)
"""A ViT-S/DeiT-S state at 224x224 (tokens x channels): the shape `balanced` sizes a format's ratio with."""


def byte_ratio(fmt: WireFormat, shape: tuple[int, ...] = VIT_S_STATE) -> float:
    """Wire bytes over fp32 bytes for a state of `shape` (exact for fp16/bf16, per model shape otherwise)."""
    return fmt.payload_bytes(shape) / (4 * math.prod(shape))


def parse_format(text: str) -> WireFormat:
    text = text.strip()
    if text in KINDS and text not in ("lowrank", "convinsert"):
        return WireFormat(text)
    if m := _CONVINSERT.fullmatch(text):
        rate = float(m.group(1))
        if not 0 < rate < 1:
            raise ValueError(f"{text!r}: the rate must be between 0 and 1")
        return WireFormat("convinsert", rate=rate)
    if m := _LOWRANK.fullmatch(text):
        rank = int(m.group(1))
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"{text!r}: the rank must be in 1..{MAX_RANK}")
        return WireFormat("lowrank", rank)
    raise ValueError(f"{text!r} is not a wire format (fp32, fp16, bf16, int8, lowrank:R, convinsert:RATE)")


@dataclass(frozen=True)
class Wire:
    """A run's wire: the default format and the cuts given their own."""

    default: WireFormat = FP32
    per_cut: tuple[tuple[str, WireFormat], ...] = ()

    def at(self, cut: str) -> WireFormat:
        """The format for the cut where the stage that starts at module `cut` receives its input."""
        return dict(self.per_cut).get(cut, self.default)

    @property
    def formats(self) -> tuple[WireFormat, ...]:
        """Every format this wire uses: the default and each cut's own."""
        return (self.default, *(f for _, f in self.per_cut))

    @property
    def lossless(self) -> bool:
        return all(f.lossless for f in self.formats)

    @property
    def learned(self) -> bool:
        """A compressor pair trained with the model (convinsert) sits at some cut."""
        return any(f.learned for f in self.formats)

    def check_cuts(self, split: list[str], what: str) -> None:
        """ValueError when a per-cut format names no cut of `split` (the split points of `what`: a run, a job)."""
        cuts = [cut for cut, _ in self.per_cut]
        if cuts and not split:
            raise ValueError(f"wire: per-cut formats ({', '.join(cuts)}) need explicit split points (--split); "
                             f"give one format for every cut instead")
        unknown = [c for c in cuts if c not in split]
        if unknown:
            raise ValueError(f"wire: {', '.join(unknown)} is not a cut of this {what} (split points: "
                             f"{', '.join(split)})")

    def __str__(self) -> str:
        parts = [] if self.default == FP32 and self.per_cut else [str(self.default)]
        return ",".join(parts + [f"{cut}={fmt}" for cut, fmt in self.per_cut])


def parse_wire(text: str) -> Wire:
    """`int8`, `blocks.4=fp16,blocks.8=int8`, or `int8,blocks.4=fp16` (ValueError naming the bad part)."""
    default, per_cut = FP32, []
    seen: set[str] = set()
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise ValueError("no wire format given")
    defaults = 0
    for part in parts:
        if not part:
            raise ValueError(f"{text!r} has an empty part")
        cut, sep, fmt = part.partition("=")
        if not sep:
            default, defaults = parse_format(part), defaults + 1
            continue
        cut = cut.strip()
        if not _CUT.fullmatch(cut):
            raise ValueError(f"{cut!r} is not a module name")
        if cut in seen:
            raise ValueError(f"cut {cut!r} is given twice")
        seen.add(cut)
        per_cut.append((cut, parse_format(fmt)))
    if defaults > 1:
        raise ValueError(f"{text!r} gives more than one format for every cut")
    return Wire(default, tuple(per_cut))
