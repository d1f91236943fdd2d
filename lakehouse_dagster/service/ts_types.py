"""The TypeScript client's structured-read types, generated from the request's JSON Schema (docs/reads.schema.json,
itself generated from routing/request.py): one declaration of the request, no hand-kept copy in the client.

``render(schema)`` turns the schema's ``$defs`` and its top object into TypeScript declarations (clients/typescript/
src/query.d.ts); test_ts_types.py fails when the committed file differs from what this renders, and prints the
command that regenerates it:

    python -m lakehouse_dagster.service.ts_types > clients/typescript/src/query.d.ts

Only what the schema uses is mapped: objects (``additionalProperties: false``), arrays and fixed-length tuples,
``anyOf`` / ``oneOf`` unions, ``enum`` / ``const``, ``$ref``; an optional field whose default is null is optional
(``?``) and not nullable; a value with no type is ``unknown`` (typed by the column, checked by the service).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "reads.schema.json"
TS_PATH = Path(__file__).resolve().parents[2] / "clients" / "typescript" / "src" / "query.d.ts"
ROOT = "Query"
HEADER = (
    "// Generated from docs/reads.schema.json by lakehouse_dagster/service/ts_types.py — do not edit by hand:\n"
    "//   python -m lakehouse_dagster.service.ts_types > clients/typescript/src/query.d.ts\n"
    "// (test_ts_types.py fails when this file and the schema drift apart). The shapes: docs/reads.md.\n"
)
_SCALARS = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}


def _type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in node:
            parts = list(dict.fromkeys(_type(n) for n in node[key]))
            return " | ".join(parts)
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items", {})
        n = node.get("minItems")
        if n is not None and n == node.get("maxItems") and n <= 4:  # a fixed-length pair: a tuple
            return "[" + ", ".join([_type(items)] * n) + "]"
        inner = _type(items)
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    if kind in _SCALARS:
        return _SCALARS[kind]
    return "unknown"


def _limits(node: dict[str, Any]) -> str:
    said = []
    for n in [node, *node.get("anyOf", [])]:
        for key, word in (("minimum", "≥"), ("maximum", "≤"), ("minItems", "at least"), ("maxItems", "at most")):
            if key in n:
                said.append(f"{word} {n[key]}{' item(s)' if 'Items' in key else ''}")
    return "; ".join(dict.fromkeys(said))


def _object(name: str, node: dict[str, Any]) -> str:
    required = set(node.get("required", ()))
    lines = [f"export interface {name} {{"]
    for field, spec in node.get("properties", {}).items():
        optional = field not in required
        t = spec
        if optional and "anyOf" in spec and spec.get("default", "absent") is None:
            kept = [n for n in spec["anyOf"] if n.get("type") != "null"]
            t = kept[0] if len(kept) == 1 else {"anyOf": kept}
        limits = _limits(spec)
        if limits:
            lines.append(f"  /** {limits} */")
        lines.append(f"  {field}{'?' if optional else ''}: {_type(t)};")
    lines.append("}")
    return "\n".join(lines)


def render(schema: dict[str, Any]) -> str:
    """The declarations of every ``$defs`` entry (alphabetical, as the schema lists them) and of the request."""
    blocks = [HEADER.rstrip("\n")]
    defs = schema.get("$defs", {})
    for name in sorted(defs):
        blocks.append(_object(name, defs[name]))
    blocks.append(_object(ROOT, schema))
    union = _type(defs["AllOf"]["properties"]["args"]["items"]) if "AllOf" in defs else "never"
    blocks.append(f"/** One node of a where tree. */\nexport type Predicate = {union};")
    return "\n\n".join(blocks) + "\n"


def main() -> None:
    sys.stdout.write(render(json.loads(SCHEMA_PATH.read_text())))


if __name__ == "__main__":
    main()
