"""The TypeScript client's request types are generated from the request's one declaration (routing/request.py →
docs/reads.schema.json → clients/typescript/src/query.d.ts): this fails when the committed file drifts from what the
schema renders, and when the client stops deriving its ReadRequest from it. No Node needed (test_service_node.py
runs the client against a live service)."""

from __future__ import annotations

import json

from lakehouse_dagster.routing.request import json_schema_text
from lakehouse_dagster.service import ts_types

CLIENT = ts_types.TS_PATH.parent


def test_query_types_are_generated_from_the_published_schema():
    schema = json.loads(ts_types.SCHEMA_PATH.read_text())
    assert ts_types.SCHEMA_PATH.read_text() == json_schema_text()  # the schema is the request's (test_read_compute)
    assert ts_types.TS_PATH.read_text() == ts_types.render(schema), (
        "clients/typescript/src/query.d.ts drifted from docs/reads.schema.json; regenerate it: "
        "python -m lakehouse_dagster.service.ts_types > clients/typescript/src/query.d.ts"
    )


def test_every_request_field_and_shape_is_declared_for_typescript():
    schema = json.loads(ts_types.SCHEMA_PATH.read_text())
    ts = ts_types.TS_PATH.read_text()
    for field in schema["properties"]:
        assert f"  {field}?: " in ts, field
    for name in schema["$defs"]:
        assert f"export interface {name} {{" in ts, name
    assert '  op: "eq" | "ne" | "lt" | "le" | "gt" | "ge";' in ts
    assert "  row_index?: [number, number][];" in ts  # inclusive [low, high] pairs
    assert '  fn: "count" | "count_distinct" | "sum" | "avg" | "min" | "max";' in ts
    index = (CLIENT / "index.d.ts").read_text()
    assert "export interface ReadRequest extends Query {" in index  # one declaration, not a restated copy
    assert "function readBody({ reader, datasetId, ...query })" in (CLIENT / "index.js").read_text()


def test_a_schema_change_shows_up_in_the_rendered_types():
    """The drift check has teeth: a field added to the schema changes what is rendered."""
    schema = json.loads(ts_types.SCHEMA_PATH.read_text())
    schema["properties"]["sample"] = {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None}
    assert "  sample?: number;" in ts_types.render(schema)
    assert ts_types.render(schema) != ts_types.TS_PATH.read_text()
