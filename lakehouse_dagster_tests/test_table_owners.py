"""Each table has one owner (issue 45): every SQL statement on an owned table sits in its owner module; the others
call the owner's functions. No import contract sees tables shared through SQL, so this test reads the package's SQL
text: every string literal of every module (docstrings aside) that names a table where SQL names one — after
``from``/``join``/``into``/``update``/``table``/``truncate``/``exists``/``only``, a comma or a quote, or as the whole
string (``sql.Identifier("…")``, a table name kept as data). Prose naming a table ("recorded in lakehouse_alerts")
does not count, nor what is never SQL: a ``help=``/``description=`` argument (a verb's, an op's, a field's text), an
``AssetKey(...)``'s path, a name followed by a lone colon (``'datasets: 2'``; SQL puts none after a table name).

The ``.sql`` files under ``schema/`` are read only to list the tables (each ``create table``): ``schema/`` owns
every table's DDL and its database-side functions run inside Postgres, so scanning them for users would say nothing.

Tables in ``NOT_YET_OWNED`` are not enforced yet; their figure is how many modules touched them when they were
listed. Give a table an owner by moving its statements into one module, then move it to ``OWNERS`` (and to the
"Table owners" section of docs/architecture.md). ``python lakehouse_dagster_tests/test_table_owners.py`` (or this
test with ``-rP``) prints what remains.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakehouse_dagster"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# table -> the module or package (under lakehouse_dagster) that holds every statement on it.
OWNERS: dict[str, str] = {
    "iceberg_sync_log": "tracking.sync_log",
    "lakehouse_alerts": "status.alerts.outbox",
    "lakehouse_complete_audit": "runbooks.complete.status",
    "lakehouse_completed": "flags.completed",
    "lakehouse_digest_capture": "tracking.capture",
    "lakehouse_digest_capture_switch": "tracking.capture",
    "lakehouse_file_digests": "parity.maintained",
    "lakehouse_file_identity": "parity.file_identity",
    "lakehouse_flag_audit": "flags.overrides",
    "lakehouse_flag_overrides": "flags.overrides_store",
    "lakehouse_lifecycle": "lifecycle.store",
    "lakehouse_lifecycle_history": "lifecycle.store",
    "lakehouse_migrations": "schema.migrate",
    "lakehouse_mirror_requests": "mirror.poller",
    "lakehouse_mirror_streams": "mirror.shards",
    "lakehouse_orphan_sweeps": "mirror.sweep",
    "lakehouse_pg_digest_deltas": "tracking.digest_sums",
    "lakehouse_pg_digest_state": "tracking.digest_sums",
    "lakehouse_pg_reconciled": "tracking.sync_log",
    "lakehouse_read_fallbacks": "flags.incidents",
    "lakehouse_read_parity": "parity.verdicts",
    "lakehouse_reader_datasets": "flags.reader_datasets",
    "lakehouse_reverse_audit": "flags.reverse_setting",
    "lakehouse_reverse_position": "mirror.reverse_lag",
    "lakehouse_reverse_settings": "flags.reverse_read",
    "lakehouse_rollout_events": "plans.store",
    "lakehouse_rollout_flags": "plans.store",
    "lakehouse_rollout_plans": "plans.store",
    "lakehouse_rollout_stages": "plans.store",
    "lakehouse_rollout_steps": "plans.store",
    "lakehouse_row_changes": "tracking.row_changes",
    "lakehouse_settings": "flags.soak_setting",
    "lakehouse_settings_audit": "flags.soak_setting",
    "lakehouse_shadow_proofs": "flags.proof",
    "lakehouse_shadow_reads": "flags.proof",
    "lakehouse_source_state": "tracking.ingest_state",
    "dataset_rows": "tracking.datasets",
    "datasets": "tracking.datasets",
    "pipelines": "tracking.datasets",
    "workspaces": "tracking.datasets",
}

# table -> modules touching it when it was listed here (2026-12-07, main b28a8c8). Shrink this list.
# Branch owners-low: none left in tracking/lake/lifecycle/parity/flags/mirror (their 32 modules, 97 uses, now call
# tracking/datasets/); outside the owner 20 modules still name dataset_rows and 27 datasets, all in the layers above.
NOT_YET_OWNED: dict[str, int] = {}

# Modules (or packages) that may name tables they do not own, and why. "*" is every table.
ALLOWED: dict[str, tuple[tuple[str, ...] | str, str]] = {
    "schema": ("*", "migrations and schema/functions own every table's DDL; migrate.py applies them"),
    "testing": (
        "*",
        "test support: foundation.py builds the app's tables as a live deployment has them, and the crash harness "
        "and lifecycle model read the database as an oracle independent of the code under test (an oracle calling "
        "the owner would check the owner against itself); nothing of the package imports it",
    ),
    "status.recording": (
        "*",
        "the recorder reads every audited table's new rows by transaction id through one generic query "
        "(design/recording.md): it names each table as data, the statements are its own",
    ),
    "cli.reverse": (
        ("dataset_rows",),
        "the reverse-off warning names the table in prose ('read from dataset_rows by a pipeline'), no statement; "
        "kept as written: the CLI's modules import no psycopg at load, and the owner's name for the table would",
    ),
    "core.locks": (
        ("lakehouse_reverse_settings",),
        "NAMED lists every advisory lock's name; a lock named after a table is no statement on it",
    ),
    "flags.candidates": (
        ("pipelines", "iceberg_sync_log", "datasets"),
        "RUNBOOK_SAFE_BLOCKED is step 2b of the writer-flip runbook verbatim (test_demo compares it with the "
        "runbook's text): the operator's own query, run as written",
    ),
    "service.metrics": (
        ("lakehouse_read_fallbacks",),
        "a Prometheus counter named like the table (lakehouse_read_fallbacks_total); no statement on it",
    ),
    "status.alerts.outbox": (
        ("lakehouse_read_parity",),
        "the keyset scan of MISMATCH verdicts filters on lakehouse_alerts (its own table) inside one limited "
        "statement, so every row of a page gives an event; split across the two owners, the limit would come "
        "before that filter and a page of verdicts already alerted could stall the scan",
    ),
}

_PRECEDES = r"(?:\b(?:from|join|into|update|table|truncate|exists|only)\s+|[,'\"]\s*)"
_FOLLOWS = r"(?![\w]|:(?!:))"  # a name followed by a lone colon is no table ('::' is a cast: 'x'::regclass)
_NOT_SQL_KEYWORDS = ("help", "description")  # argparse's help, Dagster's and pydantic's descriptions: text to read


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")


def _strings(tree: ast.AST):
    """Every string literal but docstrings and text that is never SQL: its line, its text, whether it is an argument
    of ``Identifier(...)``."""
    docs, identifiers, not_sql = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "Identifier":
            identifiers.update(id(arg) for arg in node.args)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "AssetKey":
            not_sql.update(id(n) for arg in node.args for n in ast.walk(arg))
        if isinstance(node, ast.keyword) and node.arg in _NOT_SQL_KEYWORDS:
            not_sql.update(id(n) for n in ast.walk(node.value))
    skipped = docs | not_sql
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value, id(node) in identifiers


def _names(table: str, text: str, identifier: bool, pattern: re.Pattern) -> bool:
    """Whether SQL text names the table. A whole string naming it counts when it is an ``Identifier`` or the name
    is distinctive (``lakehouse_alerts``, not ``datasets``: that one is as often a JSON key or a word)."""
    if text.strip() == table:
        return identifier or "_" in table
    return pattern.search(text) is not None


def declared_tables() -> set[str]:
    """Every table schema/ creates."""
    text = "\n".join(p.read_text().lower() for p in (PACKAGE / "schema").rglob("*") if p.suffix in (".sql", ".py"))
    return set(re.findall(r"create table (?:if not exists )?([a-z_][a-z0-9_]*)", text))


def table_users(tables: set[str]) -> dict[str, dict[str, list[str]]]:
    """table -> module -> ["line: text", ...] for every module whose SQL text names the table."""
    patterns = {t: re.compile(rf"(?i){_PRECEDES}{t}{_FOLLOWS}") for t in tables}
    users: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        for line, text, identifier in _strings(ast.parse(path.read_text(), str(path))):
            for table, pattern in patterns.items():
                if _names(table, text, identifier, pattern):
                    users[table][module].append(f"{line}: {' '.join(text.split())[:90]}")
    return users


def _inside(module: str, owner: str) -> bool:
    """An owner is a module or a package (``tracking.datasets``: the app tables, one file per concern)."""
    return module == owner or module.startswith(owner + ".")


def _allowed(module: str, table: str) -> bool:
    for prefix, (tables, _why) in ALLOWED.items():
        if (module == prefix or module.startswith(prefix + ".")) and (tables == "*" or table in tables):
            return True
    return False


def remaining_report(users) -> str:
    rows = [
        f"  {table:32} {len([m for m in users.get(table, {}) if not _allowed(m, table)]):3} modules now"
        f" ({listed} when listed)"
        for table, listed in sorted(NOT_YET_OWNED.items(), key=lambda item: (item[1], item[0]))
    ]
    return f"{len(OWNERS)} tables owned, {len(NOT_YET_OWNED)} not yet owned:\n" + "\n".join(rows)


def test_every_table_is_owned_or_listed_as_not_yet():
    tables = declared_tables()
    assert not set(OWNERS) & set(NOT_YET_OWNED), "a table is both owned and not yet owned"
    assert tables == set(OWNERS) | set(NOT_YET_OWNED), (
        f"new tables {sorted(tables - set(OWNERS) - set(NOT_YET_OWNED))} need an owner in OWNERS; "
        f"gone {sorted(set(OWNERS) | set(NOT_YET_OWNED) - tables)}"
    )
    for owner in set(OWNERS.values()) | set(ALLOWED):
        as_path = PACKAGE.joinpath(*owner.split("."))
        assert as_path.with_suffix(".py").is_file() or as_path.is_dir(), f"{owner} is no module of the package"


def test_owned_tables_are_named_only_in_their_owner():
    users = table_users(declared_tables())
    wrong = [
        f"{table} (owner {owner}) in {module} line {use}"
        for table, owner in sorted(OWNERS.items())
        for module, uses in sorted(users.get(table, {}).items())
        if not _inside(module, owner) and not _allowed(module, table)
        for use in uses
    ]
    print(remaining_report(users))
    assert not wrong, "statements on an owned table outside its owner: call the owner's functions instead\n" + (
        "\n".join(wrong)
    )


def test_an_owner_names_its_table():
    users = table_users(set(OWNERS))
    assert not [t for t, owner in OWNERS.items() if not any(_inside(m, owner) for m in users.get(t, {}))], (
        "an owner no longer names its table: the map is stale"
    )


def test_architecture_lists_the_owners():
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Table owners\n", 1)
    assert len(section) == 2, "docs/architecture.md has no '## Table owners' section"
    body = section[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `([a-z_0-9]+)` \| `([a-z_/]+?)(?:\.py|/)` \|", body, re.M))
    assert listed == {t: m.replace(".", "/") for t, m in OWNERS.items()}, (
        "docs/architecture.md's Table owners section differs from OWNERS in lakehouse_dagster_tests/test_table_owners.py"
    )


if __name__ == "__main__":
    print(remaining_report(table_users(declared_tables())))
