"""Exceptions of change tracking (issue 45). It imports nothing of the package: tracking/pgoutput.py, which capture
imports, raises from here.

Capture's own (``CaptureError``, ``RowLocked``, and ``BarrierTimeout``, which barrier.py raises) live in
capture/errors.py: ``BarrierTimeout`` is a ``CaptureError`` (exit 5, caught where capture errors are), and a subclass
here would make this module import capture, which imports pgoutput, which imports this module — a cycle.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """A pgoutput message the parser does not understand: the consumer stops instead of guessing."""


__all__ = ["ProtocolError"]
