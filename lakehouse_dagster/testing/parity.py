"""The reference the maintained digests (parity/maintained.py) are held to: per-segment digests of Postgres
computed from every row, beside the sums the triggers maintain."""

from __future__ import annotations

from lakehouse_dagster.core.errors import NotFound
from lakehouse_dagster.parity import maintained
from lakehouse_dagster.parity.digest import PgSide, PinnedPostgres, full_digest


def _columns(pg: PinnedPostgres, d) -> tuple:
    state = pg.state(d)
    if state is None:
        raise NotFound(f"dataset {d} does not exist")
    return state.columns


def grid_digest(side, lo: int, hi: int) -> dict:
    """Per-segment digest on the maintained grid, computed from every row (the reference)."""
    lo = (lo >> maintained.SEG_BITS) << maintained.SEG_BITS
    d = full_digest(side, lo, hi, everything=True, width=maintained.SEG_WIDTH)
    return maintained.nonzero({seg + (lo >> maintained.SEG_BITS): v for seg, v in (d.segments or {}).items()})


def pg_reference(dsn, d) -> dict:
    with PinnedPostgres(dsn) as pg:
        side = PgSide(pg.conn, d, _columns(pg, d))
        lo, hi = side.bounds()
        return {} if lo is None or hi is None else grid_digest(side, lo, hi + 1)


def pg_maintained(dsn, d) -> dict:
    with PinnedPostgres(dsn) as pg:
        return maintained.pg_segments(pg.conn, d, _columns(pg, d))
