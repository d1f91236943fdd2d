"""The JSON Schema of the plan file (docs/rollout-plan.schema.json is this, written out; test_rollout_plans.py keeps
them equal). For editors and CI linting of plan files; the project's own validation is plans/spec.py, whose
one-line errors say more than a schema validator can (which gate, which workspace)."""

from __future__ import annotations

import json

from lakehouse_dagster.flags.registry import READERS, WRITERS

_DURATION = {"type": "string", "pattern": r"^\s*(\d+\s*d)?\s*(\d+\s*h)?\s*(\d+\s*m)?\s*(\d+\s*s)?\s*$"}
_UUID = {"type": "string", "format": "uuid"}
_COUNT = {"type": "integer", "minimum": 0}


def plan_schema() -> dict:
    analysis = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "sample": {**_COUNT, "description": "datasets canaried at the end of the soak (default 20)"},
            "max_fallbacks": {**_COUNT, "description": "read fallbacks allowed since the stage flipped (default 0)"},
            "max_failed_syncs": {**_COUNT, "description": "failed syncs allowed since the stage flipped (default 0)"},
            "max_inconclusive": {**_COUNT, "description": "lagging / no-snapshot / error verdicts allowed (default 0)"},
            "pause_after": {**_DURATION, "description": "inconclusive this long: pause (default 10m)"},
            "retry_every": {**_DURATION, "description": "between analyses while inconclusive (default 30s)"},
            "min_reads": {"type": "integer", "minimum": 1, "description": "shadow: comparisons needed (default 20)"},
            "min_consistency": {"type": "number", "minimum": 0, "maximum": 100, "description": "shadow: % (100)"},
            "max_reverse_lag_seconds": {
                **_COUNT,
                "description": "writer: a dataset's reverse mirror behind more than this is not ok (default 60)",
            },
        },
    }
    settings = {
        "within": {**_UUID, "description": "datasets stage: pick candidates in this workspace"},
        "soak": {**_DURATION, "description": "held this long before its analysis; at least the project's soak"},
        "approval": {"type": "boolean", "description": "an operator approves before the stage starts"},
        "window": {"type": "string", "description": "e.g. 'weekdays 09:00-17:00 UTC'"},
        "max_datasets": {
            "type": "integer",
            "minimum": 1,
            "description": "refuse a stage moving more (default: no cap)",
        },
        "ok_within": {**_DURATION, "description": "reader candidates: an ok verdict this recent (24h)"},
        "analysis": analysis,
        "export_to": {
            "type": "string",
            "minLength": 1,
            "description": "complete stage: first write each dataset's rows as Parquet under <dir>/<dataset id>",
        },
    }
    scopes = {
        "shadow": {"const": True},
        "datasets": {"type": "integer", "minimum": 1},
        "workspace": {"oneOf": [_UUID, {"type": "array", "items": _UUID, "minItems": 1}]},
        "global": {"const": True},
        "complete": {
            "const": True,
            "description": "writer plans, last stage: retire the Postgres rows of the datasets the plan moved "
            "(approval always; takes approval, window, max_datasets, export_to)",
        },
    }
    stage = {
        "type": "object",
        "additionalProperties": False,
        "properties": {**scopes, **settings},
        "oneOf": [{"required": [k]} for k in scopes],
    }
    flippable_readers = [r.name for r in READERS.values() if r.ceiling != r.default]
    flippable_writers = [w.name for w in WRITERS.values() if w.ceiling != w.default]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://lakehouse-dagster/rollout-plan.schema.json",
        "title": "lakehouse rollout plan",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "reader": {"enum": flippable_readers},
            "writer": {"enum": flippable_writers},
            "mode": {"enum": ["iceberg", "iceberg_only", "iceberg_native"]},
            "note": {"type": "string", "maxLength": 500},
            "arm_reverse": {
                "type": "boolean",
                "description": "writer: turn the reverse mirror on for each dataset before its flip (default true)",
            },
            "defaults": {"type": "object", "additionalProperties": False, "properties": settings},
            "stages": {"type": "array", "minItems": 1, "items": stage},
        },
        "required": ["stages"],
        "oneOf": [{"required": ["reader"]}, {"required": ["writer"]}],
    }


def schema_text() -> str:
    return json.dumps(plan_schema(), indent=2) + "\n"
