"""`lakehouse digest-capture`: where change tracking and the maintained Postgres digest are written
(tracking/capture.py)."""

from __future__ import annotations

import sys

from lakehouse_dagster.api import capture
from lakehouse_dagster.cli.common import Result, add_command

EPILOG = """modes: triggers (default; the app's writing transaction writes the change tracking and adds the row
hashes) · after-commit (the WAL consumer writes both after the app commits: the app's statement only takes a
shared lock per dataset, and readers of the change tracking wait behind it while they catch the consumer up).
after-commit needs wal_level = logical (the embedded server has it) and sets REPLICA IDENTITY FULL on
dataset_rows. The slot holds WAL back until a reader, a canary, the consumer sensor or `catch-up` consumes it:
bound it with max_slot_wal_keep_size (the embedded server: 2GB); a slot invalidated past it needs `repair`.
after-commit was called wal-tracking (still accepted); the previous release's mode wal is gone (`lakehouse db
migrate` moved a database left in it, and said why).
exit codes: 0 done · 5 refused or could not run (the message says why; nothing was changed)."""


def register(sub) -> None:
    p = add_command(
        sub,
        "digest-capture",
        _run,
        help="show or switch where change tracking and the maintained Postgres digest are written",
        description="Capture mode: change tracking and the maintained Postgres digest written in the app's "
        "transaction (triggers) or after it, by the WAL consumer (after-commit).",
        epilog=EPILOG,
    )
    p.add_argument(
        "action",
        nargs="?",
        default="status",
        choices=("status", capture.AFTER_COMMIT, capture.TRIGGERS, "catch-up", "repair", *capture.RENAMED),
        help="status (default) · after-commit / triggers: switch · catch-up: apply what the slot holds · "
        "repair: a new slot after the old one lost WAL (drops the maintained sums)",
    )


def _run(ctx, args) -> Result:
    conn = ctx.conn
    action = args.action
    if action in capture.RENAMED:  # an operator's script keeps working
        action = capture.RENAMED[action]
        print(f"lakehouse digest-capture: note: {args.action} was renamed {action}", file=sys.stderr)
    if action == capture.AFTER_COMMIT:
        done = capture.enable(conn)
    elif action == capture.TRIGGERS:
        done = capture.disable(conn)
    elif action == "catch-up":
        done = capture.catch_up(conn)
    elif action == "repair":
        done = capture.repair(conn)
    else:
        done = {}
    st = capture.status(conn)
    lines = [
        f"capture mode: {st['mode']} (wal_level {st['wal_level']})"
        + (
            "; change tracking and the digest are written by the WAL consumer after the commit"
            if st["mode"] == capture.AFTER_COMMIT
            else ""
        )
    ]
    if done:
        lines.append("done: " + ", ".join(f"{k} {v}" for k, v in done.items()))
    if st.get("slot"):
        lines.append(
            f"slot {st['slot']}: {st.get('slot_status')}, {st.get('behind_bytes', '?')} bytes of WAL not "
            f"consumed, {st.get('retained_wal_bytes', '?')} bytes retained"
        )
    return Result({**st, "done": done}, "\n".join(lines))
