"""pictl: run pipeline-parallel inference experiments on a small cluster.

The controller (this package) never imports torch: torch lives in `remote/`,
which runs on the hosts.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("pictl")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""Where the `remote/` package (pushed to the hosts) lies beside `pictl/`: the checkout, or site-packages."""

_API = ("Cluster", "GenerateOptions", "GenerateSummary", "PruneOptions", "PruneSummary", "RunOptions", "RunSummary",
        "SweepResult", "TrainOptions", "TrainSummary", "generate", "generate_async", "load_cluster", "prune",
        "prune_async", "run_experiment", "run_experiment_async", "runs", "sweep", "sweep_async", "train",
        "train_async", "tune", "tune_async")
__all__ = ["PROJECT_ROOT", "__version__", *_API]


def __getattr__(name: str) -> object:
    """`from pictl import run_experiment, load_cluster, ...`: the library (`pictl.api`), loaded when first asked
    for, so that importing any part of pictl does not load the sessions (and the CLI's start-up stays short)."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module("pictl.api"), name)
    raise AttributeError(f"module 'pictl' has no attribute {name!r}")
