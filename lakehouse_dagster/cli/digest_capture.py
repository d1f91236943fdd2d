"""`lakehouse digest-capture`: where the maintained Postgres digest is computed (tracking/capture.py)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.tracking import capture

EPILOG = """modes: triggers (default; the app's writing transaction adds the row hashes) · wal (a logical
replication slot; the canaries apply the changes after the commit, so the app pays only change tracking) ·
wal-tracking (change tracking after the commit too: the app's statement only takes a shared lock per dataset,
and readers that pair the tracking with rows wait behind it while they catch the consumer up).
wal needs wal_level = logical (the embedded server has it) and sets REPLICA IDENTITY FULL on dataset_rows.
The slot holds WAL back until a canary, a mirror run's checks or `catch-up` consumes it: bound it with
max_slot_wal_keep_size (the embedded server: 2GB); a slot invalidated past it needs `repair`.
exit codes: 0 done · 5 refused or could not run (the message says why; nothing was changed)."""


def register(sub) -> None:
    p = add_command(
        sub,
        "digest-capture",
        _run,
        help="show or switch where the maintained Postgres digest is computed",
        description="Capture mode of the maintained Postgres digest: in the app's transaction "
        "(triggers) or after it, from the WAL (wal).",
        epilog=EPILOG,
    )
    p.add_argument(
        "action",
        nargs="?",
        default="status",
        choices=("status", "wal", "wal-tracking", "triggers", "catch-up", "repair"),
        help="status (default) · wal / wal-tracking / triggers: switch · catch-up: apply what the slot holds · "
        "repair: a new slot after the old one lost WAL (drops the maintained sums)",
    )


def _run(ctx, args) -> Result:
    conn = ctx.conn
    if args.action in ("wal", "wal-tracking"):
        done = capture.enable(conn, tracking=args.action == "wal-tracking")
    elif args.action == "triggers":
        done = capture.disable(conn)
    elif args.action == "catch-up":
        done = capture.catch_up(conn)
    elif args.action == "repair":
        done = capture.repair(conn)
    else:
        done = {}
    st = capture.status(conn)
    lines = [
        f"capture mode: {st['mode']} (wal_level {st['wal_level']})"
        + ("; change tracking is written by the WAL consumer" if st["mode"] == "wal-tracking" else "")
    ]
    if done:
        lines.append("done: " + ", ".join(f"{k} {v}" for k, v in done.items()))
    if st.get("slot"):
        lines.append(
            f"slot {st['slot']}: {st.get('slot_status')}, {st.get('behind_bytes', '?')} bytes of WAL not "
            f"consumed, {st.get('retained_wal_bytes', '?')} bytes retained"
        )
    return Result({**st, "done": done}, "\n".join(lines))
