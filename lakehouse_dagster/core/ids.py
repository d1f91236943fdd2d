"""Parsing ids from operators: a malformed UUID is refused with the value and what a good one looks like."""

from __future__ import annotations

import uuid

from lakehouse_dagster.core.errors import BadInput


def parse_uuid(value: object, what: str = "id") -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value).strip())
    except (ValueError, AttributeError, TypeError):
        raise BadInput(
            f"{what} {value!r} is not a valid UUID (expected 8-4-4-4-12 hex digits, "
            "e.g. 123e4567-e89b-12d3-a456-426614174000)"
        ) from None
