"""The docs stay true to the code: the configuration reference names every variable the project reads (and only
those), the architecture page draws the layers the import-linter contract enforces, the README stays short.

Pure file parsing: no database, no Dagster."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakehouse_dagster"
TESTS = ROOT / "lakehouse_dagster_tests"
SETTINGS = PACKAGE / "core" / "settings"
CONFIGURATION = ROOT / "docs" / "configuration.md"
TEST_SUITE_SECTION = "## The test suite"

SETTING_VARS = PACKAGE / "core" / "setting_vars.py"


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def read_directly(path: Path) -> set[str]:
    """The variables a module reads by name: os.environ.get("NAME"), os.getenv("NAME"), os.environ["NAME"]."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            reads = isinstance(func, ast.Attribute) and (
                (func.attr == "get" and _is_environ(func.value)) or func.attr == "getenv"
            )
            if reads and isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
    return names


def variables_read_in_settings() -> set[str]:
    """Every variable core/settings/ reads: its sections' declarations, and any read by name beside them."""
    from lakehouse_dagster.core.settings import declarations

    declared = {name for _, _, var in declarations() for name in var.names}
    beside = set().union(*(read_directly(path) for path in sorted(SETTINGS.glob("*.py"))))
    return declared | beside | read_directly(SETTING_VARS)


def string_constants(directory: Path) -> set[str]:
    """Every string literal in the directory's Python files that is a whole environment variable name (so a
    docstring that mentions one does not count as reading it)."""
    found: set[str] = set()
    for path in directory.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"[A-Z][A-Z0-9_]+", node.value):
                    found.add(node.value)
    return found


def documented(text: str) -> set[str]:
    return set(re.findall(r"\bLAKEHOUSE_[A-Z0-9_]+\b", text))


def configuration_sections() -> tuple[str, str]:
    """(everything but the test suite's section, the test suite's section)."""
    text = CONFIGURATION.read_text()
    assert TEST_SUITE_SECTION in text, f"{CONFIGURATION.name} lost its '{TEST_SUITE_SECTION}' section"
    head, rest = text.split(TEST_SUITE_SECTION, 1)
    suite, _, tail = rest.partition("\n## ")
    return head + tail, suite


def test_settings_parser_finds_the_variables():
    names = variables_read_in_settings()
    # If the way settings.py reads the environment changes, the parser must change with it.
    assert {"LAKEHOUSE_PG_DSN", "LAKEHOUSE_HOME", "LAKEHOUSE_SOAK_SECONDS", "ENABLE_ICEBERG_SYNC"} <= names
    assert len(names) >= 20, sorted(names)


def test_every_setting_is_in_the_configuration_reference():
    text = CONFIGURATION.read_text()
    missing = sorted(name for name in variables_read_in_settings() if f"`{name}`" not in text)
    assert not missing, f"read in core/settings/ but not documented in docs/configuration.md: {missing}"


def test_every_documented_variable_is_read():
    project, suite = configuration_sections()
    read_by_package = string_constants(PACKAGE)
    unread = sorted(documented(project) - read_by_package)
    assert not unread, f"named in docs/configuration.md but read nowhere in lakehouse_dagster: {unread}"
    unread_by_tests = sorted(documented(suite) - string_constants(TESTS))
    assert not unread_by_tests, f"documented as the test suite's but read nowhere in its code: {unread_by_tests}"


def test_architecture_draws_the_contracts_layers_in_order():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawn = re.findall(r"^(lakehouse_dagster\.[a-z_]+)\s", text, flags=re.MULTILINE)
    assert drawn == layers


def test_readme_is_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
