"""docs/architecture.md is drawn from the packages (issue 45): every package is named, every public face (a module
or package that declares ``__all__``) is named as the face its callers import, and the lifecycle's picture is the
code's own table of transitions. Module-level naming is test_docs_truth.py's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lakehouse_dagster.lifecycle.states import AUTHORITY, STATES, TRANSITIONS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakehouse_dagster"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# How a row says that callers import a face: "the face callers import" after the module, or, for a package whose
# ``__init__`` is the face, "callers import the package".
FACE_WORDS = ("the face callers import", "callers import the package")


def _rows() -> dict[str, str]:
    text = ARCHITECTURE.read_text().split("\n## One line per package\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z_/]+/)` \| (.*) \|$", text, re.M))


def _packages() -> list[str]:
    return sorted(
        p.parent.relative_to(PACKAGE).as_posix() + "/"
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts and p.parent != PACKAGE
    )


def _declares_all(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(
        isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(
            getattr(t, "id", None) == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
        for node in tree.body
    )


def _faces() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and _declares_all(p))


def _row_of(package: str, rows: dict[str, str]) -> tuple[str, str]:
    """The row that describes a package path: its own, else the nearest enclosing package's."""
    own = [p for p in rows if package.startswith(p)]
    best = max(own, key=len) if own else ""
    return best, rows.get(best, "")


def test_every_package_is_named_in_the_architecture_page():
    rows = _rows()
    assert "core/" in rows and "tracking/datasets/" in rows, "the 'One line per package' table lost its rows"
    unnamed = []
    for package in _packages():
        if package in rows:
            continue
        parent, row = _row_of(package, rows)
        inner = package[len(parent) :]
        if f"`{inner}`" not in row:
            unnamed.append(f"{package} (neither its own row nor `{inner}` in the row of {parent or 'no package'})")
    assert not unnamed, "packages docs/architecture.md does not name:\n" + "\n".join(unnamed)


def test_every_public_face_is_named_as_the_face_its_callers_import():
    rows = _rows()
    missing = []
    for path in _faces():
        inside = path.relative_to(PACKAGE).as_posix()
        if inside.startswith("testing/"):
            continue  # the tests' support: no caller in the package
        if path.name == "__init__.py":
            package = inside.removesuffix("__init__.py")
            row = rows.get(package, "")
            if not any(w in row for w in FACE_WORDS):
                missing.append(f"{package}: its own row, saying 'callers import the package'")
            continue
        package, row = _row_of(inside, rows)
        found = re.search(rf"`{re.escape(path.name)}` \(([^()]|\([^()]*\))*\)", row)
        if not found or not any(w in found.group(0) for w in FACE_WORDS):
            missing.append(f"{inside}: `{path.name}` (… the face callers import) in the row of {package}")
    assert not missing, "public faces (modules declaring __all__) the architecture page does not name:\n" + (
        "\n".join(missing)
    )


def lifecycle_picture() -> str:
    """The lifecycle as arrows, one line per state and verb, from ``TRANSITIONS``."""
    width = max(len(s) for s in STATES)
    verb_width = max(len(v) for t in TRANSITIONS for v in t.verbs)
    lines = [f"{'state':{width}}  {'truth':8}  {'moved by':{verb_width}}      to"]
    for state in STATES:
        by_verb: dict[str, list[str]] = {}
        for t in TRANSITIONS:
            if t.before == state:
                for verb in t.verbs:
                    by_verb.setdefault(verb, []).append(t.after)
        for i, (verb, afters) in enumerate(by_verb.items()):
            head = f"{state:{width}}  {AUTHORITY[state]:8}" if i == 0 else " " * (width + 10)
            lines.append(f"{head}  {verb:{verb_width}} ──▶  {', '.join(afters)}")
    return "\n".join(line.rstrip() for line in lines)


def test_the_lifecycle_picture_is_the_table_of_transitions():
    text = ARCHITECTURE.read_text()
    section = text.split("\n## The lifecycle\n", 1)
    assert len(section) == 2, "docs/architecture.md has no '## The lifecycle' section"
    block = re.search(r"```text\n(.*?)\n```", section[1], re.S)
    assert block, "the lifecycle section has no ```text picture"
    assert block.group(1) == lifecycle_picture(), (
        "docs/architecture.md's lifecycle picture differs from lifecycle/states.py TRANSITIONS; paste the output "
        "of `python lakehouse_dagster_tests/test_architecture_doc.py`"
    )


def test_the_scans_see_what_they_should():
    """If the scans stopped finding packages or faces, every test above would pass on anything."""
    assert {"tracking/datasets/", "runbooks/complete/", "status/alerts/"} <= set(_packages())
    faces = {p.relative_to(PACKAGE).as_posix() for p in _faces()}
    assert {"lifecycle/__init__.py", "mirror/reverse.py", "runbooks/complete/__init__.py"} <= faces
    picture = lifecycle_picture()
    assert all(s in picture for s in STATES) and "──▶" in picture


if __name__ == "__main__":
    print(lifecycle_picture())
