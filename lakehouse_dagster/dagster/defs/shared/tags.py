"""Run tags and metadata that name a dataset in the Dagster UI, built in one place.

Partition keys are dataset uuids, operators know dataset names: every run the mirror, ingest, canary, flag and
rollout jobs start carries ``lakehouse/dataset`` (id) and ``lakehouse/dataset_name``, and a flag or rollout run
``lakehouse/reader`` or ``lakehouse/writer`` and ``lakehouse/scope`` (``dataset:<id>``, ``workspace:<id>``,
``global``), so the runs list filters by them; every materialization and check result carries ``dataset_name`` and
``dataset_id``. Identifiers and versions are text metadata: Dagster plots an asset's numeric metadata over time, and
a partitioned asset would draw the ids of different datasets as one series.

A job's ``tags`` cannot see its run config, so a launchpad job tags its own run from its config when its op starts
(``tag_run``); sensors and schedules put the tags on their RunRequests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
import psycopg

from lakehouse_dagster.api.datasets import names_of

DATASET = "lakehouse/dataset"
DATASET_NAME = "lakehouse/dataset_name"
READER = "lakehouse/reader"
WRITER = "lakehouse/writer"
SCOPE = "lakehouse/scope"
PLAN = "lakehouse/plan"  # a rollout plan's runs (flips, analyses): filter the runs list by the plan id
PLAN_STEP = "lakehouse/plan_step"  # which step of the plan (the controller finds its runs by it)
_MAX_VALUE = 200  # tag values are shown in the runs list: a long dataset name is cut, never refused


def _value(v: object) -> str:
    return str(v)[:_MAX_VALUE]


def _uuid(raw: object) -> uuid.UUID | None:
    try:
        return raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw).strip())
    except (ValueError, AttributeError, TypeError):
        return None


def datasets_tags(conn: psycopg.Connection, dataset_ids: Iterable[object]) -> dict[uuid.UUID, dict[str, str]]:
    """The dataset tags of many datasets in one query (a sensor tick); an unknown id gets its id tag only.
    (No workspace tag: the runs list shows every tag of a run, and the scope tag names it for flag runs.)"""
    ids = {i for i in (_uuid(d) for d in dataset_ids) if i is not None}
    found: dict = names_of(conn, list(ids)) if ids else {}
    return {i: {DATASET: str(i), **({DATASET_NAME: _value(found[i])} if i in found else {})} for i in ids}


def dataset_tags(conn: psycopg.Connection, dataset_id: object) -> dict[str, str]:
    """``lakehouse/dataset`` and ``lakehouse/dataset_name``; a malformed id is tagged as given
    (the op then refuses it), so even a refused run can be found by what the operator typed."""
    i = _uuid(dataset_id)
    if i is None:
        return {DATASET: _value(dataset_id)} if dataset_id not in (None, "") else {}
    return datasets_tags(conn, [i])[i]


def _metadata(tags: Mapping[str, str], dataset_id: object) -> dict[str, dg.MetadataValue]:
    """``dataset_name`` / ``dataset_id`` as text metadata for a materialization or check result."""
    return {
        "dataset_name": dg.MetadataValue.text(tags.get(DATASET_NAME, "(unknown dataset)")),
        "dataset_id": dg.MetadataValue.text(tags.get(DATASET, str(dataset_id))),
    }


def name_run(context, conn: psycopg.Connection, dataset_id: object) -> dict[str, dg.MetadataValue]:
    """Tag the step's run with the dataset (one query) and return its name metadata: the one call an asset,
    op or check makes."""
    tags = dataset_tags(conn, dataset_id)
    tag_run(context, tags)
    return _metadata(tags, dataset_id)


def dataset_metadata(conn: psycopg.Connection, dataset_id: object) -> dict[str, dg.MetadataValue]:
    """The name metadata alone, for a result logged by a run of many datasets (no run tag to add)."""
    return _metadata(dataset_tags(conn, dataset_id), dataset_id)


def scope_value(dataset: object = None, workspace: object = None) -> str:
    """``dataset:<id>`` / ``workspace:<id>`` / ``global``: one tag value per scope, as the operator gave it."""
    if dataset not in (None, ""):
        return _value(f"dataset:{str(dataset).strip()}")
    if workspace not in (None, ""):
        return _value(f"workspace:{str(workspace).strip()}")
    return "global"


def flag_tags(
    conn: psycopg.Connection, kind: str, name: str | None, dataset: object = None, workspace: object = None
) -> dict[str, str]:
    """A flag or rollout run: the reader/writer, the scope, and the dataset (with its name) when it is one."""
    tags = {SCOPE: scope_value(dataset, workspace)}
    if name:
        tags[READER if kind == "read" else WRITER] = _value(name)
    if dataset not in (None, ""):
        tags.update(dataset_tags(conn, dataset))
    return tags


def plan_tags(plan_id: object, step_key: str) -> dict[str, str]:
    """A rollout plan's run: the plan id and the step (plans/controller.py), found again by them after a restart."""
    return {PLAN: _value(plan_id), PLAN_STEP: _value(step_key)}


def text(value: object) -> dg.MetadataValue:
    """An identifier, version or snapshot id as text metadata (never plotted); None as an empty text."""
    return dg.MetadataValue.text("" if value is None else str(value))


def ids_as_text(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Core results' metadata with identifiers and versions (keys ending in ``_id`` or ``_version``) as text."""
    return {
        k: text(v) if (k.endswith("_id") or k.endswith("_version")) and not isinstance(v, dg.MetadataValue) else v
        for k, v in metadata.items()
    }


def tag_run(context, tags: Mapping[str, str]) -> None:
    """Add the tags this run lacks (a launchpad run, a materialization started from the UI); a sensor's run
    already has them and is left alone."""
    run = context.run  # (an asset check's context has no run_id of its own)
    missing = {k: v for k, v in tags.items() if run.tags.get(k) != v}
    if missing:
        context.instance.add_run_tags(run.run_id, missing)


DATASET_NAMES = "lakehouse/dataset_names"  # a run of many datasets: their names (display only, cut to 255 characters)


def batch_tags(named: Mapping[uuid.UUID, Mapping[str, str]], dataset_ids: Iterable[uuid.UUID]) -> dict[str, str]:
    """The dataset tags of a run of many datasets: one dataset keeps its id and name tags (filterable); several list
    their names for display (``named``: from ``datasets_tags``)."""
    ids = list(dataset_ids)
    if len(ids) == 1:
        return dict(named.get(ids[0], {DATASET: str(ids[0])}))
    return {DATASET_NAMES: ",".join(named.get(i, {}).get(DATASET_NAME, str(i)) for i in ids)[:255]}
