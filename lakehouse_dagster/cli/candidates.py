"""`lakehouse candidates`: the write-flip runbook's step 2b (SAFE / BLOCKED) and what each dataset still lacks for
a flip (flags/candidates.py)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table

HELP = "the runbook's step 2b (SAFE / BLOCKED) plus what each dataset still lacks for a flip"


def register(sub) -> None:
    add_candidates(sub, "candidates", help=HELP)


def add_candidates(sub, name: str, help: str | None):
    """The `candidates` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    ca = add_command(sub, name, _candidates, **({} if help is None else {"help": help}))
    ca.add_argument("--writer", default="sync.full", help="the writer to flip (default sync.full)")
    return ca


def _candidates(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        SAFE,
        write_flip_candidates,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    found = write_flip_candidates(ctx.conn, args.writer)
    data = [c.as_dict() for c in found]
    rows = [{**d, "ready": "yes" if d["ready"] else "no", "still needs": "; ".join(d["reasons"])} for d in data]
    ready = sum(c.ready for c in found)
    text = table(rows, ["verdict", "ready", "name", "row_count", "dataset_id", "writer_mode", "still needs"])
    piped = [c for c in found if c.runbook_verdict != SAFE]
    if piped:  # the reverse mirror keeps a native pipeline input's dataset_rows (docs/design/reverse-mirror.md)
        text += (
            f"\n{len(piped)} pipeline input(s): {sum(c.safe for c in piped)} SAFE with the reverse mirror on, "
            f"{sum(not c.safe for c in piped)} BLOCKED with it off (lakehouse reverse on --dataset <id>)"
        )
    text += (
        f"\n{len(found)} identity-ready dataset(s), {ready} ready to flip {args.writer}: "
        # the runbook's step 3 is the flip (preflight canary, gated set, verify, first native sync and its canary),
        # not a bare set
        f'lakehouse write-flags flip {args.writer} --dataset <id> --note "fase4 canary"'
    )
    return Result(data, text)
