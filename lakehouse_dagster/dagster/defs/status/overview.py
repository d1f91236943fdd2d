"""The migration overview asset ``lakehouse/migration_overview``: first the migration at a glance (readers and writers
× stages in one table, the lifecycle states, the datasets that need attention with a link to each one's partition
page), then the counts of status/overview.py as numeric metadata (Dagster plots each across materializations: the
migration's progress over time). Refreshed every 5 minutes and after every rollout job.

Dagster renders a table's cells as plain text (ui-core ``MetadataEntry.tsx``: ``record[column]?.toString()``), so the
partition pages are also given as a markdown list of links (``attention_links``), which the UI renders clickable;
the mirror stream's shards (``mirror_stream``) are a markdown table for the same reason: each run links to its page.
"""

import datetime as dt

import dagster as dg
import psycopg

from lakehouse_dagster.api.flags import READ, SERVABLE_READERS, SHADOW_KEEP_DAYS, current_soak, prune_shadow_reads
from lakehouse_dagster.api.mirror import STREAM_OFF, down_count, shard_state
from lakehouse_dagster.api.plans import PlanStatus, live_statuses
from lakehouse_dagster.api.status import ATTENTION_SHOWN, POSTGRES, Overview, compute_overview
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, MIGRATION_OVERVIEW

# The jobs whose end (success or failure: a write_flip can fail after its flag changed) refreshes the overview.
ROLLOUT_JOBS = (
    "read_flip",
    "write_flip",
    "write_rollback",
    "complete",
    "set_flag",
    "clear_flag",
    "rollout_start",
    "rollout_pause",
    "rollout_resume",
    "rollout_approve",
    "rollout_abort",
)

# Three narrow columns, so the table fits the asset page's value column (issue 33: six columns cut off the last two at
# 1,700 px). The dataset's id and page are one click away: attention_links links each name to its partition page,
# and `lakehouse status --json` lists the ids.
ATTENTION_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("dataset", "string", description="the dataset's name (its workspace)"),
        dg.TableColumn("problem", "string", description="its problems, most urgent first"),
        dg.TableColumn(
            "reason", "string", description="why, shortened (the partition page and lakehouse status say all)"
        ),
    ]
)
REASON_CHARS = 90


def short(text: str, limit: int = REASON_CHARS) -> str:
    """At most ``limit`` characters, cut at a word with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:") + "…"


PLANS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("plan", "string", description="the plan's id (lakehouse rollout status <id>)"),
        dg.TableColumn("moves", "string", description="the reader or writer and its target mode"),
        dg.TableColumn("state", "string", description="active, paused or aborting"),
        dg.TableColumn("stage", "string", description="the stage it is at, of how many, and its phase"),
        dg.TableColumn("next_action", "string", description="what happens next, or the command to run"),
        dg.TableColumn("blocking", "string", description="what it waits for (a soak, an approval, a window...)"),
    ]
)


def plans_metadata(plans: list[PlanStatus]) -> dict:
    """The live rollout plans (plans/status.py, what `lakehouse rollout status` prints): counts to plot and a table."""
    meta: dict = {
        "rollouts/live": dg.MetadataValue.int(len(plans)),
        "rollouts/paused": dg.MetadataValue.int(sum(p.state == "paused" for p in plans)),
    }
    meta["rollouts"] = dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "plan": str(p.id),
                    "moves": f"{'reader' if p.kind == 'read' else 'writer'} {p.name} → {p.mode}",
                    "state": p.state,
                    "stage": f"{p.stage} of {p.stages}: {p.stage_what} ({p.phase})",
                    "next_action": p.next_action,
                    "blocking": p.blocking or "",
                }
            )
            for p in plans
        ],
        schema=PLANS_SCHEMA,
    )
    return meta


def partition_page(dataset_id: object) -> str:
    """The UI's page of a dataset's partition of iceberg/dataset_table, relative to the UI's root (the form the
    UI's own partition tags link to: ``?view=partitions&partition=<key>``)."""
    return f"/assets/{ICEBERG_TABLE.to_user_string()}?view=partitions&partition={dataset_id}"


def _md(text: object) -> str:
    """Text safe inside a markdown link label or list item."""
    return "".join("\\" + c if c in "[]()*_`|\\<>#" else c for c in str(text))


def run_page(run_id: str) -> str:
    """The UI's page of a run, relative to the UI's root."""
    return f"/runs/{run_id}"


def _ago(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f} s ago"


# The asset page lists the first 100 metadata entries of a materialization and hides the rest behind "Show N more"
# (dagster-webserver 1.13, ui-core MetadataTable: ``displayedByDefault = 100``). The overview's entries stay within it,
# so nothing an operator reads (the rollouts' counts came last) is hidden: a stage a flag cannot take is not plotted,
# nor any flag's `postgres` (the datasets the mirror has not reached: stage/postgres), and each compute reader plots
# its proven datasets and its rate only (the held list says the rest). test_overview.py checks the worst case.
UI_ENTRIES = 100

# The UI shows a markdown value inline below this many characters, longer ones behind "[Show Markdown]"
# (dagster-webserver 1.13, ui-core MetadataEntry: ``mdStr.length < 1e3``).
MD_INLINE_CHARS = 1000


def _shard_row(s: dict, count: int, bound: float) -> str:
    state = shard_state(s, bound)
    state = state if s["alive"] else f"**{state}**"
    run = f"[{s['run_id'][:8]}]({run_page(s['run_id'])})" if s["run_id"] else "—"
    lag = "—" if s["lag_s"] is None else f"{s['lag_s']:.1f} s"
    backlog = "—" if s["backlog"] is None else s["backlog"]
    return (
        f"| {s['shard']} of {count} | {state} | {run} | {_ago(s['heartbeat_age_s'])} | {lag} | {backlog} | "
        f"{_ago(s['last_commit_age_s'])} |"
    )


def stream_markdown(stream: dict) -> str:
    """The mirror stream's shards as a markdown table (one row per shard, its run linked to the run's page), or one
    line when streaming is off. Past what the UI shows inline, only the shards not alive are listed (the alive ones
    counted: `lakehouse status` lists every shard)."""
    if not stream["on"]:
        return STREAM_OFF
    shards, bound = stream["shards"], stream["down_after_s"]
    alive = sum(s["alive"] for s in shards)
    head = [
        f"**{len(shards)} shard(s): {alive} alive, {down_count(stream)} DOWN** (no heartbeat for {bound} s: batch "
        "runs cover its datasets meanwhile; a DOWN shard's lag and backlog are from its last heartbeat)",
        "",
        "| shard | state | run | heartbeat | lag | backlog | last commit |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [_shard_row(s, len(shards), bound) for s in shards]
    text = "\n".join(head + rows)
    if len(text) < MD_INLINE_CHARS or not alive:
        return text
    rows = [_shard_row(s, len(shards), bound) for s in shards if not s["alive"]]
    note = f"\n\n{alive} alive shard(s) not listed: `lakehouse status` lists every shard."
    return "\n".join(head + rows) + note if rows else head[0] + note


def stream_metadata(stream: dict) -> dict:
    """The shards' counts to plot (zeros when streaming is off: one continuous series each) and their table."""
    shards = stream["shards"] if stream["on"] else []
    lags = [s["lag_s"] for s in shards if s["alive"] and s["lag_s"] is not None]
    return {
        "mirror_stream": dg.MetadataValue.md(stream_markdown(stream)),
        "stream/shards": dg.MetadataValue.int(len(shards)),
        "stream/alive": dg.MetadataValue.int(sum(s["alive"] for s in shards)),
        "stream/down": dg.MetadataValue.int(down_count(stream) if shards else 0),
        "stream/backlog": dg.MetadataValue.int(sum(s["backlog"] or 0 for s in shards if s["alive"])),
        "stream/max_lag_seconds": dg.MetadataValue.float(float(max(lags, default=0.0))),
    }


def held_markdown(ov: Overview) -> str:
    """Per dataset, what still reads it from dataset_rows (complete refuses it until they read Iceberg), linked to its
    partition page; then each compute reader's shadow consistency."""
    lines = [
        f"- [{_md(h.name)}]({partition_page(h.dataset_id)}) ({_md(h.state)}): {_md(h.describe())}" for h in ov.held
    ]
    if ov.held_total > len(ov.held):
        lines.append(f"- … and {ov.held_total - len(ov.held)} more (`lakehouse status --json` lists {ATTENTION_SHOWN})")
    head = (
        f"**{ov.held_total} dataset(s) held on Postgres**: `complete` is refused for each until these read Iceberg"
        if ov.held_total
        else "nothing holds a dataset on Postgres: no pipeline input, no declared reader on Postgres"
    )
    proven = f"; proven: {_md(ov.threshold.describe())}" if ov.threshold else ""
    shadow = ["", f"**Shadow consistency** (since each dataset's last change of schema{proven}):"]
    shadow += [f"- {_md(x.describe())}" for x in ov.shadow]
    return "\n".join([head, "", *lines, *shadow] if lines else [head, *shadow])


def held_metadata(ov: Overview) -> dict:
    """The held list, the counts per holder, each compute reader's shadow counts (zeros included: one series each;
    its rate only once something was compared)."""
    meta: dict = {"held_on_postgres": dg.MetadataValue.md(held_markdown(ov))}
    meta["held_total"] = dg.MetadataValue.int(ov.held_total)
    meta.update({f"held by {h}": dg.MetadataValue.int(n) for h, n in ov.held_by.items()})
    for x in ov.shadow:  # the datasets compared and the failures are in held_on_postgres (UI_ENTRIES)
        meta[f"shadow {x.reader}: proven"] = dg.MetadataValue.int(x.proven)
        if x.rate is not None:
            meta[f"shadow {x.reader}: consistency %"] = dg.MetadataValue.float(x.rate)
    return meta


# The glance: the datasets' own stage, then one row per reader and writer, one column per stage; a stage a flag of that
# kind never takes is "·". Markdown, not a TableMetadataValue: the UI draws a table's cells unwrapped and cuts off the
# columns past the value column's width (issue 33), a markdown table's cells wrap. Under MD_INLINE_CHARS, so it is
# shown inline rather than behind "[Show Markdown]": the blocked datasets' names are cut short when they would not fit.
GLANCE_COLUMNS = ("postgres", "mirrored", "reads_iceberg", "iceberg_only", "blocked", "native")
BLOCKED_NAMED = 3  # blocked datasets named in a cell (the attention list names every one)
NA = "·"


def blocked_cell(n: int, names: list[str], named: int = BLOCKED_NAMED) -> str:
    """A count of blocked datasets with the first few named, in bold: ``**2: customers, orders**``."""
    if not n:
        return "0"
    shown = [_md(x) for x in names[:named]]
    more = f" +{n - len(shown)}" if n > len(shown) else ""
    return f"**{n}: {', '.join(shown)}{more}**" if shown else f"**{n}**"


def glance_markdown(ov: Overview) -> str:
    """Readers and writers × stages with the lifecycle states above: the migration at a glance (the same counts as
    the numeric series below it)."""
    for named in (BLOCKED_NAMED, 1, 0):
        text = _glance(ov, named)
        if len(text) < MD_INLINE_CHARS:
            break
    return text


def _glance(ov: Overview, named: int) -> str:
    states = " · ".join(f"{state} {n}" for state, n in ov.lifecycle.items() if n) or "none"
    head = [
        f"**{ov.datasets} datasets** · lifecycle: {states}",
        "",
        "| | " + " | ".join(c.replace("_", " ") for c in GLANCE_COLUMNS) + " |",
        "| --- |" + " --- |" * len(GLANCE_COLUMNS),
    ]
    st = ov.dataset_stages
    cells = {c: str(st[c]) if c in st else NA for c in GLANCE_COLUMNS} | {
        "blocked": blocked_cell(ov.blocked, ov.blocked_names, named)
    }
    rows = ["| **datasets** | " + " | ".join(cells[c] for c in GLANCE_COLUMNS) + " |"]
    for (kind, name), stages in ov.flag_stages.items():
        cells = {c: str(stages[c]) if c in stages else NA for c in GLANCE_COLUMNS}
        if "blocked" in stages:
            cells["blocked"] = blocked_cell(stages["blocked"], ov.blocked_names, named)
        who = f"{'reader' if kind == READ else 'writer'} {_md(name)}"
        rows.append(f"| {who} | " + " | ".join(cells[c] for c in GLANCE_COLUMNS) + " |")
    return "\n".join(head + rows)


# The UI's key column does not wrap a word: a key longer than this without a space ran into the Timestamp column
# (issue 44). Keys are words of at most this many characters, joined by spaces where they need more.
KEY_WORD_CHARS = 24


def overview_metadata(ov: Overview) -> dict:
    """What an operator reads first (the glance, the lifecycle, the attention list and its links), then every count
    as a number (present in every materialization, zeros included, so each plot is one continuous series). A key
    reads as its plot's title."""
    meta: dict = {"migration": dg.MetadataValue.md(glance_markdown(ov))}
    meta["attention"] = dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "dataset": f"{a.name} ({a.workspace or a.workspace_id or 'no workspace'})",
                    "problem": ", ".join(a.problems),
                    "reason": short(a.reason),
                }
            )
            for a in ov.attention
        ],
        schema=ATTENTION_SCHEMA,
    )
    links = [
        f"- [{_md(a.name)}]({partition_page(a.dataset_id)}) ({_md(a.workspace or a.workspace_id or 'no workspace')})"
        f": {_md(', '.join(a.problems))}"
        for a in ov.attention
    ]
    more = ov.attention_total - len(ov.attention)
    if more:
        links.append(f"- … and {more} more (`lakehouse status --json` lists every count; fix these first)")
    meta["attention_links"] = dg.MetadataValue.md("\n".join(links) if links else "nothing needs attention")
    meta["datasets"] = dg.MetadataValue.int(ov.datasets)
    meta.update({f"stage/{stage}": dg.MetadataValue.int(n) for stage, n in ov.dataset_stages.items()})
    meta["stage/blocked"] = dg.MetadataValue.int(ov.blocked)
    meta.update({f"lifecycle/{state}": dg.MetadataValue.int(n) for state, n in ov.lifecycle.items()})
    for (kind, name), stages in ov.flag_stages.items():  # not `postgres`: stage/postgres plots it once (UI_ENTRIES)
        what = "reader" if kind == READ else "writer"
        meta.update(
            {f"{what} {name}: {stage}": dg.MetadataValue.int(n) for stage, n in stages.items() if stage != POSTGRES}
        )
    meta.update({f"verdict/{v}": dg.MetadataValue.int(n) for v, n in ov.verdicts.items()})
    meta["wedged"] = dg.MetadataValue.int(ov.wedged)
    meta["behind"] = dg.MetadataValue.int(ov.behind)
    meta["never_synced"] = dg.MetadataValue.int(ov.never_synced)
    meta["lagging"] = dg.MetadataValue.int(ov.lagging)
    meta["max_lag_seconds"] = dg.MetadataValue.float(float(ov.max_lag_seconds or 0.0))  # 0: nothing behind
    meta["lag_threshold_seconds"] = dg.MetadataValue.int(ov.lag_threshold_seconds)
    meta["native"] = dg.MetadataValue.int(ov.native)
    meta["native_unsafe"] = dg.MetadataValue.int(ov.native_unsafe)
    # the reverse mirror (Iceberg -> dataset_rows) of the native datasets, and the pipeline inputs it unblocks
    meta["piped_reverse_on"] = dg.MetadataValue.int(ov.piped_reverse_on)
    meta["reverse/on"] = dg.MetadataValue.int(ov.reverse_on)
    meta["reverse/off"] = dg.MetadataValue.int(ov.reverse_off)
    meta["reverse/behind"] = dg.MetadataValue.int(ov.reverse_behind)
    meta["reverse/max_lag_seconds"] = dg.MetadataValue.float(float(ov.reverse_max_lag_seconds or 0.0))  # 0: none
    meta["reverse_lag"] = dg.MetadataValue.md(
        "\n".join(f"- [{_md(r.name)}]({partition_page(r.dataset_id)}): {_md(r.describe())}" for r in ov.reverse_lags)
        or f"every native dataset with the reverse mirror on is caught up ({ov.reverse_on})"
    )
    # read fallbacks of the last day by reader (in process or reported by the app: POST /lakehouse/fallback)
    meta.update({f"fallbacks {r.name}": dg.MetadataValue.int(ov.fallbacks.get(r.name, 0)) for r in SERVABLE_READERS})
    meta.update({f"attention/{p}": dg.MetadataValue.int(n) for p, n in ov.problems.items()})
    meta["attention_total"] = dg.MetadataValue.int(ov.attention_total)
    meta.update(stream_metadata(ov.stream))
    meta.update(held_metadata(ov))
    meta["seconds"] = dg.MetadataValue.float(ov.seconds)
    return meta


def prune_old_comparisons(
    context: dg.AssetExecutionContext, conn: psycopg.Connection, plans: list[PlanStatus]
) -> int | None:
    """The shadow comparisons' retention (flags/proof.py ``prune_shadow_reads``), at each refresh: the overview reads
    their proofs, which the pruning never changes. A live read plan keeps its reader's since the plan began. None when
    the database refused (logged; the overview is computed all the same)."""
    live: dict[str, dt.datetime] = {}
    for p in plans:
        if p.kind == READ:
            live[p.name] = min(p.created_at, live.get(p.name, p.created_at))
    try:
        now = conn.execute("select now()").fetchone()[0]  # type: ignore[index]
        pruned = prune_shadow_reads(conn, now=now, live_plans=live)
    except psycopg.Error as exc:
        context.log.warning(f"shadow comparisons not pruned: {' '.join(str(exc).split())[:300]}")
        return None
    if pruned:
        context.log.info(f"pruned {pruned} shadow comparison(s) older than {SHADOW_KEEP_DAYS} days (proofs unchanged)")
    return pruned


@dg.asset(
    key=MIGRATION_OVERVIEW,
    group_name="lakehouse",
    kinds={"postgres"},
    description="The migration at a glance: first the table `migration` (the datasets, then each reader and writer, "
    "by stage: on Postgres, mirrored, read from Iceberg, iceberg_only, blocked with the blocked datasets named, "
    "native), the datasets per lifecycle state, and the datasets that need attention (MISMATCH, native-unsafe, "
    "check error, wedged, lagging, read fallback, blocked), linked to their pages; per dataset what still holds it on "
    "Postgres (pipeline inputs, declared readers, with the compute readers' shadow proof) and each compute reader's "
    "shadow consistency; the live rollout plans and the mirror stream's shards. Below, every count as a number: Metadata's Plots view draws each over time.",
)
def migration_overview(context: dg.AssetExecutionContext, lakehouse: LakehouseResource) -> dg.MaterializeResult:
    settings = lakehouse.settings()
    with lakehouse.connect() as conn:
        plans = live_statuses(conn, soak_seconds=current_soak(conn, settings).seconds, history=0)
        prune_old_comparisons(context, conn, plans)  # logged, not an entry (UI_ENTRIES)
        ov = compute_overview(conn, settings)
    st = ov.dataset_stages
    context.log.info(
        f"{ov.datasets} datasets: {st['postgres']} Postgres, {st['mirrored']} mirrored, {st['reads_iceberg']} "
        f"read from Iceberg, {st['native']} native, {ov.blocked} blocked; {ov.attention_total} need attention "
        f"({ov.seconds:.2f} s)"
    )
    meta = {**overview_metadata(ov), **plans_metadata(plans)}
    # The UI lists metadata in this order: the glance and what needs an operator first, then the counts (their plots).
    first = (
        "migration",
        "attention_links",
        "attention",
        "held_on_postgres",
        "rollouts",
        "mirror_stream",
        "attention_total",
    )
    return dg.MaterializeResult(metadata={**{k: meta[k] for k in first}, **meta})


migration_overview_job = dg.define_asset_job(
    "migration_overview_job",
    selection=dg.AssetSelection.assets(MIGRATION_OVERVIEW),
    executor_def=dg.in_process_executor,
    description="Refresh lakehouse/migration_overview (the schedule does every 5 minutes; a rollout job's end too).",
)

migration_overview_schedule = dg.ScheduleDefinition(
    name="migration_overview_schedule",
    job=migration_overview_job,
    cron_schedule="*/5 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 5 minutes: the migration overview, so its plots follow lag and verdicts between rollouts.",
)


def refresh_after(context: dg.RunStatusSensorContext):
    """A refresh of the overview once a rollout job's run has ended (one per run: its id is the run key)."""
    run = context.dagster_run
    if run.job_name not in ROLLOUT_JOBS:
        return dg.SkipReason(f"{run.job_name} is not a rollout job")
    return dg.RunRequest(run_key=f"overview-after:{run.run_id}", tags={"lakehouse/after_run": run.run_id})


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    request_job=migration_overview_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=f"Refresh the migration overview when a rollout job succeeds ({', '.join(ROLLOUT_JOBS)}).",
)
def migration_overview_after_rollout(context: dg.RunStatusSensorContext):
    return refresh_after(context)


@dg.run_failure_sensor(
    request_job=migration_overview_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refresh the migration overview when a rollout job fails (a flag may have changed before the "
    "step that failed).",
)
def migration_overview_after_failed_rollout(context: dg.RunFailureSensorContext):
    return refresh_after(context)
