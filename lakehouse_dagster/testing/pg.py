"""Databases for tests and benches on one Postgres server."""

from __future__ import annotations

import re


def with_db(dsn: str, db: str) -> str:
    """``dsn`` with its database replaced by ``db``."""
    # Both URI forms the project produces: postgresql://user:@/db?host=... and postgresql://u:p@h:port/db
    return re.sub(r"^(postgres(?:ql)?://[^/]*/)([^?]*)", lambda m: m.group(1) + db, dsn, count=1)
