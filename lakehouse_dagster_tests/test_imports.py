"""Imports stay at module level, where the layer contract (pyproject.toml) and a reader both see them. An import
inside a function is for an optional or heavy dependency only, and says why on its line (``# lazy: …``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lakehouse_dagster"


def _function_level_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for_type_checkers = {  # `if TYPE_CHECKING:` imports are for annotations, never run
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, (ast.Import, ast.ImportFrom))
                and node.col_offset > 0
                and id(node) not in for_type_checkers
            ):
                yield path.relative_to(PACKAGE.parent), node, lines[node.end_lineno - 1]


def test_every_function_level_import_says_why():
    silent = [
        f"{path}:{node.lineno}: {line.strip()}" for path, node, line in _function_level_imports() if "# " not in line
    ]
    assert not silent, "imports inside functions without a reason (# lazy: …) on their line:\n" + "\n".join(silent)


def test_the_package_never_imports_lakehouse_dagster_tests():
    found = [
        f"{path}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            (name or "").startswith("lakehouse_dagster_tests")
            for name in ([node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        )
    ]
    assert not found, found


def test_a_function_over_80_lines_says_why_in_its_docstring():
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 80
        and "Long on purpose" not in (ast.get_docstring(node) or "")
    ]
    assert not long, "functions over 80 lines without 'Long on purpose: <why>' in their docstring:\n" + "\n".join(long)


def test_the_write_paths_load_no_digest_machinery_unless_asked():
    """numba's hash kernel and DuckDB cost a mirror ~55 MB of peak memory: only digests pay for them."""
    code = (
        "import sys\n"
        "import lakehouse_dagster.mirror.sync, lakehouse_dagster.sources.writers, lakehouse_dagster.routing.write_router\n"
        "print(sorted(m for m in ('numba', 'duckdb', 'dagster') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
