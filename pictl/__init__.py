"""pictl: run pipeline-parallel inference experiments on a small cluster.

The controller (this package) never imports torch: torch lives in `remote/`,
which runs on the hosts.
"""

__version__ = "0.1.0"
