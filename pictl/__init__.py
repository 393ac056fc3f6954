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
