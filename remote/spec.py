"""The run specification the controller writes and every host reads (torch-free).

One JSON file per run (`protocol.SPEC_FILE`), so a host never parses command-line
strings built from user values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

DATA_KINDS = ("synthetic", "cifar10", "cifar100", "imagefolder")
POLICIES = ("explicit", "equal")


@dataclass
class DataSpec:
    """Where the images come from."""

    kind: str = "synthetic"
    """synthetic | cifar10 | cifar100 | imagefolder"""
    path: str | None = None
    """Directory holding the data set (not used for synthetic data)."""
    split: str = "test"
    """Which part of CIFAR to read: train or test."""


@dataclass
class RunSpec:
    """Everything a host needs to run its part of one experiment."""

    model: str = "deit_small_patch16_224"
    num_classes: int = 1000
    seed: int = 0
    checkpoint: str | None = None
    allow_pickle: bool = False
    stages: int = 1
    policy: str = "equal"
    split_points: list[str] = field(default_factory=list)
    chunk: int = 1
    images: int = 48
    warmup: int = 1
    repeats: int = 3
    threads: int = 1
    data: DataSpec = field(default_factory=DataSpec)
    check_images: int = 8
    progress_interval_s: float = 1.0
    trace_steps: int = 0
    """Profile this many steps in one extra untimed pass after the timed ones (0: none)."""
    pg_timeout_s: float = 300.0
    run_id: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict) -> RunSpec:
        raw = dict(raw)
        raw["data"] = DataSpec(**raw.get("data", {}))
        return cls(**raw)

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
