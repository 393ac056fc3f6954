"""pictl: run pipeline-parallel inference experiments on a small cluster.

The controller (this package) never imports torch: torch lives in `remote/`,
which runs on the hosts.
"""

__version__ = "0.1.0"

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The tree pictl runs from: `remote/` (pushed to the hosts), `profiles/`, the shipped `hosts.toml`."""
