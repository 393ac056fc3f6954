"""Errors raised on a host. `BadInput` means the request itself is wrong (exit 2)."""

from __future__ import annotations


class BadInput(Exception):
    """The spec, checkpoint or data cannot work; retrying will not help."""
