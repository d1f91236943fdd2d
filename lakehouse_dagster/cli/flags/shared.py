"""What the flags verbs share: the kind's word, the scope options, a scope and a change as the verbs print them."""

from __future__ import annotations

from lakehouse_dagster.api.flags import READ, WRITE  # no psycopg: a usage error answers at once
from lakehouse_dagster.cli.common import scope_args as _scope_args  # noqa: F401 - the flags verbs' name for it
from lakehouse_dagster.cli.common import where as _where  # noqa: F401 - the flags verbs' name for it

_KIND_WORD = {READ: "reader", WRITE: "writer"}


def _change_data(change) -> dict:
    return {
        "kind": change.flag.kind,
        "name": change.flag.name,
        "scope": change.scope.scope,
        "scope_id": change.scope.scope_id,
        "before": change.before,
        "after": change.after,
        "changed": change.changed,
        "audit_id": change.audit.id if change.audit else None,
    }
