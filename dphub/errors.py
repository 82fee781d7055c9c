"""Errors that reach the user as one readable line.

Every error dphub raises on purpose is a :class:`DphubError`: it carries a message that is safe to
print (it never contains note text) and the process exit code. The CLI prints ``error: <message>``
and exits with that code; anything else is a bug and is reported with a log-file path instead of a
traceback.
"""

from __future__ import annotations


class DphubError(Exception):
    """Base class: a user-facing failure with a PHI-free message and an exit code (default 2)."""

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class InputError(DphubError):
    """Input data is malformed: bad offsets, unknown labels, wrong encoding, empty files..."""


class FormatError(InputError):
    """A corpus file does not follow its format. Messages name the file and line/record."""


class LabelError(InputError):
    """A label that no registered schema knows."""


class ConfigError(DphubError):
    """Invalid options or configuration (dphub.toml, flags, manifests)."""


class PrivacyError(DphubError):
    """A differential-privacy requirement cannot be met or an accounting check failed."""


class CardError(DphubError):
    """A model card is missing, malformed, or fails its schema / accounting checks."""


class HubError(DphubError):
    """A hub operation failed (repo missing, revision unknown, network)."""


class PublishRefused(HubError):
    """The publish gate refused an artifact; there is no override."""


class PullRefused(HubError):
    """A pulled artifact failed verification or policy; nothing was registered."""


class ModelError(DphubError):
    """A model directory cannot be loaded (missing files, wrong format, unsafe weights)."""
