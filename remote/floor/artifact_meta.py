"""The metadata of a pruned-model artifact, read without torch (the controller needs it too).

An artifact is one `.safetensors` file: the pruned weights, plus, in the header's
string-to-string metadata, one JSON document under `pictl.artifact`. A safetensors
header is an 8-byte little-endian length and that many bytes of JSON, so reading it
needs neither torch nor the safetensors package, and never touches the weights.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from remote.floor.errors import BadInput

ARTIFACT_KEY = "pictl.artifact"
FORMAT_VERSION = 1
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass
class ArtifactMeta:
    """What rebuilds the pruned model, and where it came from."""

    base_model: str
    """timm architecture the model was pruned from."""
    num_classes: int
    heads: dict[str, int]
    """Attention module name -> its head count; every other width is a tensor's shape in the file."""
    model_kwargs: dict = field(default_factory=dict)
    """Extra timm constructor arguments of the base model (img_size, depth, ...)."""
    ratio: float = 0.0
    importance: str = ""
    global_pruning: bool = False
    prune_heads: bool = False
    params_base: int = 0
    params: int = 0
    macs_base: int = 0
    macs: int = 0
    dataset: str = ""
    accuracy: dict = field(default_factory=dict)
    """top-1 before pruning, right after it, per fine-tuning epoch and the kept best."""
    compressors: list = field(default_factory=list)
    """A model trained over `--wire convinsert` with its learned pairs kept: each pair's cut, in order, as
    {"at": "blocks.4", "wire": "convinsert:0.25"} (tensors `wire_pairs.N.*`; `remote.toolkit.kept_pair`)."""
    widths: dict = field(default_factory=dict)
    """For people: embedding width and per-block heads, head dim and MLP width."""
    created: str = ""
    format: int = FORMAT_VERSION

    def to_header(self) -> dict[str, str]:
        return {ARTIFACT_KEY: json.dumps(asdict(self), sort_keys=True)}


def read_header(path: str | Path) -> dict:
    """The JSON header of a safetensors file, or one clear error naming the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise BadInput(f"model artifact {p}: no such file")
    try:
        with p.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if not 2 <= size <= _MAX_HEADER:
                raise ValueError(f"header length {size}")
            header = json.loads(fh.read(size))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        return header
    except (OSError, ValueError, struct.error) as exc:
        raise BadInput(f"model artifact {p}: not a safetensors file ({exc})") from None


def read_artifact_meta(path: str | Path) -> ArtifactMeta | None:
    """The pictl metadata of a safetensors file; None for a plain state dict."""
    raw = (read_header(path).get("__metadata__") or {}).get(ARTIFACT_KEY)
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
        if fields.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {fields.get('format')}, this pictl reads {FORMAT_VERSION}")
        return ArtifactMeta(**fields)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"model artifact {Path(path).expanduser()}: unreadable pictl metadata ({exc})") from None
