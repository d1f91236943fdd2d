"""The whole code location in one snapshot (dagster-open-platform's test_defs.py idea): every asset with its group,
kinds, partitions and deps, every check and whether it blocks, every job, sensor (default status, interval) and
schedule, and the resource's fields. A change to any of them shows here as a diff to review.

Regenerate after an intended change (a new job, a merge of branches that each added some), then read the diff:

    LAKEHOUSE_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest -q -p no:cacheprovider lakehouse_dagster_tests/test_defs.py
"""

from __future__ import annotations

import os
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("snapshots") / "definitions.txt"


def _describe(defs) -> str:
    g = defs.resolve_asset_graph()
    lines = ["# assets: key | group | kinds | partitions | deps"]
    for key in sorted(g.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = g.get(key)
        parts = node.partitions_def.name if node.partitions_def is not None else "-"
        deps = ", ".join(sorted(p.to_user_string() for p in node.parent_keys)) or "-"
        lines.append(f"{key.to_user_string()} | {node.group_name} | {', '.join(sorted(node.kinds))} | {parts} | {deps}")
    lines.append("# checks: asset | name | blocking")
    for ck in sorted(g.asset_check_keys, key=lambda c: (c.asset_key.to_user_string(), c.name)):
        lines.append(f"{ck.asset_key.to_user_string()} | {ck.name} | {g.get_check_spec(ck).blocking}")
    lines.append("# jobs")
    lines += sorted(j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__"))
    lines.append("# sensors: name | default status | minimum interval (s)")
    lines += sorted(f"{s.name} | {s.default_status.value} | {s.minimum_interval_seconds}" for s in defs.sensors)
    lines.append("# schedules: name | cron | default status")
    lines += sorted(f"{s.name} | {s.cron_schedule} | {s.default_status.value}" for s in defs.schedules)
    lines.append("# resources: name | class | fields")
    for name, resource in sorted(defs.resources.items()):
        fields = ", ".join(sorted(type(resource).model_fields))
        lines.append(f"{name} | {type(resource).__name__} | {fields}")
    return "\n".join(lines) + "\n"


def test_the_definitions_graph_is_the_reviewed_one(monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_PG_DSN", "postgresql://snapshot@localhost/none")  # never connected to
    from lakehouse_dagster.dagster.definitions import build

    described = _describe(build())
    if os.environ.get("LAKEHOUSE_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(described)
    assert described == SNAPSHOT.read_text(), (
        "the code location changed; if intended, regenerate (see this module's docstring) and review the diff"
    )
