"""Every way a fetch can fail, each with the condition reason the ModelVersion status shows.

The CLI turns these into one clear log line and an exit code; the status reporter turns them
into a False condition whose `reason` is the class's `reason` and whose message is str(error).
"""

from __future__ import annotations


class FetchError(Exception):
    """Base class: `reason` is CamelCase for a condition, `exit_code` for the Job."""

    reason = "FetchFailed"
    exit_code = 1
    # Whether the artifact was downloaded completely before the failure (verification failures).
    after_download = False


class InvalidSourceURI(FetchError):
    reason = "InvalidSourceURI"
    exit_code = 2


class SourceNotFound(FetchError):
    reason = "SourceNotFound"
    exit_code = 3


class SourceAuthFailed(FetchError):
    reason = "SourceAuthFailed"
    exit_code = 4


class SourceUnavailable(FetchError):
    """The server kept failing (5xx, resets, timeouts) after every retry."""

    reason = "SourceUnavailable"
    exit_code = 5


class InsufficientSpace(FetchError):
    reason = "InsufficientSpace"
    exit_code = 6


class ChecksumMismatch(FetchError):
    reason = "ChecksumMismatch"
    exit_code = 7
    after_download = True


class WrongArchitecture(FetchError):
    reason = "WrongArchitecture"
    exit_code = 8
    after_download = True


class InvalidModelFile(FetchError):
    """The file is not a readable GGUF although the ModelVersion says format gguf."""

    reason = "InvalidModelFile"
    exit_code = 9
    after_download = True


class SizeMismatch(FetchError):
    """The server's declared size and the bytes received disagree."""

    reason = "SizeMismatch"
    exit_code = 10
