"""The migration overview for a terminal (``lakehouse status``): the counts, the reverse mirror, what holds datasets
on Postgres and the attention list, as lines (status/overview.py computes them; the asset renders the same Overview
as metadata)."""

from __future__ import annotations

from lakehouse_dagster.flags.registry import READ
from lakehouse_dagster.mirror.shards import shard_lines
from lakehouse_dagster.status.overview import (
    ATTENTION_SHOWN,
    FALLBACK_WINDOW_SECONDS,
    MIRRORED,
    NATIVE,
    POSTGRES,
    READS_ICEBERG,
    Overview,
)

HELD_SHOWN = 10  # held datasets named in the text (the JSON and the asset list more)


def held_lines(ov: Overview) -> list[str]:
    """What still holds datasets on Postgres (complete refuses them), and the compute readers' shadow consistency."""
    by = ", ".join(f"{h} {n}" for h, n in ov.held_by.items() if n) or "nothing"
    lines = [f"held on Postgres (complete refused until they read Iceberg): {ov.held_total} dataset(s), by {by}"]
    for h in ov.held[:HELD_SHOWN]:
        lines.append(f"  {h.name} ({h.dataset_id}) {h.state}: {h.describe()}")
    if ov.held_total > HELD_SHOWN:
        lines.append(f"  ... and {ov.held_total - HELD_SHOWN} more (lakehouse status --json lists {ATTENTION_SHOWN})")
    proven = f"; proven: {ov.threshold.describe()}" if ov.threshold else ""
    lines += [f"shadow consistency (since each dataset's last change of schema{proven}):"]
    lines += [f"  {x.describe()}" for x in ov.shadow]
    return lines


REVERSE_SHOWN = 10  # behind datasets named in the text (the JSON and the asset's metadata list more)


def reverse_lines(ov: Overview) -> list[str]:
    """The reverse mirror of the native datasets: on/off, how many are behind and by how much, the worst named."""
    lag = "-" if ov.reverse_max_lag_seconds is None else f"{ov.reverse_max_lag_seconds:.0f} s"
    lines = [
        f"reverse mirror (Iceberg -> dataset_rows): {ov.reverse_on} native dataset(s) with it on, {ov.reverse_behind} "
        f"behind, largest reverse lag {lag}; {ov.reverse_off} with it off (a rollback needs a backfill)"
    ]
    for r in ov.reverse_lags[:REVERSE_SHOWN]:
        lines.append(f"  {r.name} ({r.dataset_id}): {r.describe()}")
    if ov.reverse_behind > REVERSE_SHOWN:
        lines.append(f"  ... and {ov.reverse_behind - REVERSE_SHOWN} more (lakehouse reverse status)")
    return lines


def text_lines(ov: Overview) -> list[str]:
    """The overview for a terminal (``lakehouse status``)."""
    st = ov.dataset_stages
    lines = [
        "lifecycle: " + (" ".join(f"{k}={v}" for k, v in ov.lifecycle.items() if v) or "no dataset"),
        f"{ov.datasets} tabular dataset(s): {st[POSTGRES]} on Postgres only, {st[MIRRORED]} mirrored, "
        f"{st[READS_ICEBERG]} read from Iceberg, {st[NATIVE]} written iceberg-native; {ov.blocked} blocked "
        f"(pipeline input, F3, reverse mirror off); {ov.piped_reverse_on} pipeline input(s) SAFE with the reverse "
        "mirror on",
        "verdicts: " + " ".join(f"{k}={v}" for k, v in ov.verdicts.items()) + f" wedged={ov.wedged}",
        f"behind the mirror: {ov.behind} ({ov.never_synced} never synced), {ov.lagging} lagging past "
        f"{ov.lag_threshold_seconds} s, largest lag "
        + ("-" if ov.max_lag_seconds is None else f"{ov.max_lag_seconds:.0f} s"),
        f"written iceberg-native: {ov.native} ({ov.native_unsafe} failing the write-flip gates)",
        *reverse_lines(ov),
        *held_lines(ov),
        f"read fallbacks in the last {FALLBACK_WINDOW_SECONDS // 3600} h: "
        + (" ".join(f"{r}={n}" for r, n in ov.fallbacks.items()) or "none"),
        "",
    ]
    width = max(len(f"reader {name}") for _, name in ov.flag_stages)
    for (kind, name), stages in ov.flag_stages.items():
        what = "reader" if kind == READ else "writer"
        lines.append(f"{what} {name}".ljust(width) + "  " + "  ".join(f"{s}={n}" for s, n in stages.items()))
    lines += ["", *shard_lines(ov.stream), ""]
    if not ov.attention_total:
        lines.append("nothing needs attention")
        return lines
    lines.append(
        f"{ov.attention_total} dataset(s) need attention ("
        + ", ".join(f"{n} {p}" for p, n in ov.problems.items() if n)
        + ")"
        + (f"; the {len(ov.attention)} most urgent:" if ov.attention_total > len(ov.attention) else ":")
    )
    for a in ov.attention:
        lines.append(f"  {a.problem:<13} {a.name} ({a.dataset_id}) workspace {a.workspace or a.workspace_id}")
        lines.append(f"                {a.reason}")
    return lines
