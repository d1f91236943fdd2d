"""The capture modes' errors: a switch that cannot be made or a consumer that cannot run (``CaptureError``, exit
code 5), the datasets row lock the consumer does not wait for (``RowLocked``), and the after-commit reader's barrier
that waited out its timeout (``BarrierTimeout``, raised by tracking/barrier.py)."""

from __future__ import annotations

from lakehouse_dagster.core.errors import LakehouseError


class CaptureError(LakehouseError):
    """Capture mode cannot be switched or the consumer cannot run; the message says why and what to do."""

    exit_code = 5


class RowLocked(CaptureError):
    """Capture mode after-commit: a datasets row the consumer must write stayed locked by another transaction."""


class BarrierTimeout(CaptureError):
    """The dataset's writers kept a transaction open past the timeout: its tracking cannot be read exactly."""
