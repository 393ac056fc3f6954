"""One base error, a subclass per domain, each with its documented exit code.

The CLI prints `str(error)` as one line on stderr and exits with `exit_code`; the
dashboard shows the same text.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 3
EXIT_UNREACHABLE = 4
EXIT_OUTPUT_MISMATCH = 5
EXIT_NOT_READY = 6
EXIT_INTERRUPTED = 130


class PictlError(Exception):
    """Base of every error pictl reports to a user."""

    exit_code = EXIT_INTERNAL


class ConfigError(PictlError):
    """hosts.toml, a profile or a command-line value is wrong. Nothing was started."""

    exit_code = EXIT_BAD_INPUT


class TransportError(PictlError):
    """A host could not be reached or a command could not be started on it."""

    exit_code = EXIT_UNREACHABLE


class HostKeyError(TransportError):
    """The host answered, but its key is unknown or changed: trusting it is the user's call."""


class AuthError(TransportError):
    """The host answered, but refused our user or key."""


class RunFailed(PictlError):
    """A rank or the serial run failed on a host."""

    exit_code = EXIT_RUN_FAILED


class OutputMismatch(PictlError):
    """The pipeline's logits differ from the serial run's."""

    exit_code = EXIT_OUTPUT_MISMATCH


class Interrupted(PictlError):
    """The user stopped the run (Ctrl-C)."""

    exit_code = EXIT_INTERRUPTED
