"""One base error, a subclass per domain, each with its documented exit code.

The CLI prints `str(error)` as one line on stderr and exits with `exit_code`; the
dashboard shows the same text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 3
EXIT_UNREACHABLE = 4
EXIT_OUTPUT_MISMATCH = 5
EXIT_NOT_READY = 6
EXIT_FLAGGED = 7
EXIT_BUSY = 8
EXIT_WRITE_FAILED = 9
EXIT_SUSPECT = 10
EXIT_SIGNATURE = 11
EXIT_TAMPERED = 12
EXIT_CODE_MISMATCH = 13
EXIT_RULES = 14
EXIT_NOT_REPRODUCED = 15
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


class TooLarge(TransportError):
    """A file on a host is larger than pictl reads of its kind: never read whole into memory."""


class HostKeyError(TransportError):
    """The host answered, but its key is unknown or changed: trusting it is the user's call."""


class AuthError(TransportError):
    """The host answered, but refused our user or key."""


class NotReady(PictlError):
    """A host answers but cannot run pictl's work: no python or venv there, a workdir it cannot create."""

    exit_code = EXIT_NOT_READY


class HostBusy(PictlError):
    """Another run holds a host's lease (its workdir): nothing was started; `--wait` queues instead."""

    exit_code = EXIT_BUSY


class RunFailed(PictlError):
    """A rank or the serial run failed on a host."""

    exit_code = EXIT_RUN_FAILED

    def __init__(self, message: str, where: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.where: dict[str, object] = where or {}
        """Where it failed, for the record's `error`: host, rank, message and the host's last lines."""

    @classmethod
    def on(cls, host: str, rank: int | None, what: str, message: str, tail: Iterable[str] = ()) -> Self:
        """`what` failed on `host` (and `rank`): one line naming them, and the record's details."""
        where = f"host '{host}'" + (f" rank {rank}" if rank is not None else "")
        return cls(f"{what} failed on {where}: {message}",
                   {"host": host, "rank": rank, "message": message, "last_lines": list(tail)})


class HostLost(RunFailed):
    """A rank died without a word (killed, out of memory, its host's power or link gone) rather than failing on
    its own input: the host is lost to the run. `run --on-host-loss continue` carries on without it; otherwise,
    and where nothing is left to continue on, it ends the run as any failure does (exit 3)."""

    host: str = ""
    rank: int | None = None
    detail: str = ""
    """What was seen of the loss, without the host and rank (`SilentDeath.message`)."""
    failed_at: float | None = None
    """When the controller saw the launch fail (its clock, `time.time()`)."""

    @classmethod
    def on(cls, host: str, rank: int | None, what: str, message: str, tail: Iterable[str] = ()) -> Self:
        lost = super().on(host, rank, what, message, tail)
        lost.host, lost.rank, lost.detail = host, rank, message
        return lost


class OutputMismatch(PictlError):
    """The pipeline's logits differ from the serial run's."""

    exit_code = EXIT_OUTPUT_MISMATCH


class Flagged(PictlError):
    """The run finished, but its result raised sanity flags and `--strict` was given."""

    exit_code = EXIT_FLAGGED


class Suspect(PictlError):
    """The run finished, but its result cannot be true as measured (a speedup above what an exact pipeline
    reaches, a serial baseline something else slowed): the result is printed, SUSPECT, with the cause."""

    exit_code = EXIT_SUSPECT


class RecordWriteFailed(PictlError):
    """A result was measured but could not be written (a full disk, a read-only directory): it was printed
    first, and the half-written file removed."""

    exit_code = EXIT_WRITE_FAILED


class SignatureInvalid(PictlError):
    """`pictl verify`: a bundle's signature does not hold over its manifest, or its key is not an allowed signer."""

    exit_code = EXIT_SIGNATURE


class BundleTampered(PictlError):
    """`pictl verify`: a bundle's member differs from the hash its signed manifest gives (changed after signing),
    or one is missing or added."""

    exit_code = EXIT_TAMPERED


class CodeMismatch(PictlError):
    """`pictl verify`: the code in a bundle is not the code its run's summary says the hosts ran."""

    exit_code = EXIT_CODE_MISMATCH


class RulesBroken(PictlError):
    """`pictl verify`: a bundle's run does not keep to the preset's grading rules (protocol, exactness, accuracy
    floor): nothing was re-run."""

    exit_code = EXIT_RULES


class NotReproduced(PictlError):
    """`pictl verify`: the re-run's speedup interval lies below the bundle's claim: the claim is not reproduced."""

    exit_code = EXIT_NOT_REPRODUCED


class Interrupted(PictlError):
    """The user stopped the run (Ctrl-C, SIGTERM, SIGHUP)."""

    exit_code = EXIT_INTERRUPTED
