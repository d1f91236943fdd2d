"""The faces in lakehouse_dagster/api/ (issue 45): each names in ``__all__`` exactly what it re-exports, every name
resolves to its home's object, mypy sees the same names (the TYPE_CHECKING imports), and importing a face loads
none of its homes (the CLI's fast --help). The contract that the adapters import only through them is
import-linter's ("Adapters import only the capability faces (lakehouse_dagster.api), core and the demo",
pyproject.toml)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "lakehouse_dagster" / "api"
FACES = sorted(p.stem for p in API.glob("*.py") if p.name != "__init__.py")


def test_the_scan_sees_the_faces():
    assert {"reverse", "parity", "complete", "flips", "capture", "lifecycle"} <= set(FACES)
    assert {"flags", "status", "alerts", "plans", "datasets", "schema"} <= set(FACES)


def _type_checking_names(face: str) -> dict[str, str]:
    tree = ast.parse((API / f"{face}.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                names.update({a.asname or a.name: imp.module for a in imp.names})
    return names


@pytest.mark.parametrize("face", FACES)
def test_a_face_reexports_exactly_its_names(face):
    mod = importlib.import_module(f"lakehouse_dagster.api.{face}")
    assert sorted(mod.__all__) == sorted(mod._HOME), "__all__ and the lazy table differ"
    assert _type_checking_names(face) == mod._HOME, "what mypy sees differs from what loads"
    for name, home in mod._HOME.items():
        assert getattr(mod, name) is getattr(importlib.import_module(home), name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018


@pytest.mark.parametrize("face", FACES)
def test_a_face_holds_no_logic(face):
    """Only the table, ``__all__`` and the loader: a capability's code stays in its layers."""
    tree = ast.parse((API / f"{face}.py").read_text())
    defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defs == ["__getattr__"]


def test_importing_the_faces_loads_none_of_their_homes():
    code = (
        "import json, sys\n"
        + "".join(f"import lakehouse_dagster.api.{f}\n" for f in FACES)
        + "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = set(
        json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    )
    homes = {h for f in FACES for h in importlib.import_module(f"lakehouse_dagster.api.{f}")._HOME.values()}
    assert not homes & loaded
    assert not {"psycopg", "pyiceberg", "pyarrow", "dagster"} & loaded


PACKAGE = API.parent
ADAPTERS = ("cli", "dagster", "service")
# what an adapter may import of the package besides the faces: core (settings, errors, ids, db), the adapters
# themselves, and demo/ (the demo workspace, a caller of capabilities like the adapters, above the api layer: no face
# could re-export it without an upward import)
ALLOWED = {"api", "core", "demo", *ADAPTERS}


def _imports_of_the_package(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "lakehouse_dagster":  # from lakehouse_dagster import x
            names = [f"lakehouse_dagster.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        found += [(node.lineno, n) for n in names if n.startswith("lakehouse_dagster.")]
    return found


def test_the_scan_sees_the_faces_of_the_mirror_reads_sources_and_lake():
    assert {"mirror", "reads", "shadow", "sources", "lake", "ingest_bench"} <= set(FACES)


def test_the_adapters_import_only_faces_core_and_demo():
    """Every import in cli/, dagster/, service/ (at the top, inside a function or under TYPE_CHECKING): a package that
    import-linter's forbidden list does not name yet would slip past the contract, not past this scan."""
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for adapter in ADAPTERS
        for path in sorted((PACKAGE / adapter).rglob("*.py"))
        for line, name in _imports_of_the_package(path)
        if name.split(".")[1] not in ALLOWED
    ]
    assert not outside, "an adapter imports a capability past its face:\n" + "\n".join(outside)
