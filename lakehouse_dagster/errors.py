"""One exception family, so the CLI and the ops can print a one-line reason and pick an exit code."""


class LakehouseError(Exception):
    """A refusal or failure with a message fit for an operator: what was wrong and what to do."""

    exit_code = 2


class BadInput(LakehouseError):
    """The caller asked for something invalid (unknown name, malformed uuid, mode above ceiling...)."""

    exit_code = 2


class NotFound(LakehouseError):
    exit_code = 3


class SyncFailed(LakehouseError):
    """A sync failed loudly; nothing was committed."""

    exit_code = 4


class FlipRefused(LakehouseError):
    """A flag change would strand consumers or skip a runbook prerequisite (flags/gates.py); nothing written."""

    exit_code = 6


class Backpressure(LakehouseError):
    """Admission bound (G2) reached: retry later. The CLI's analogue of the runbook's HTTP 503."""

    exit_code = 75  # EX_TEMPFAIL
