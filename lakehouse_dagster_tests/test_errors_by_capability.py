"""Errors by capability (issue 45): every exception class of the package is defined in its package's errors.py,
under a name no other exception class has, but for the few a short allow-list says why. Read from the source (no
import), so a class defined in any module, imported or not, is seen."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lakehouse_dagster"

# Exception classes that stay outside an errors module, each with why. Keyed by name (names are unique).
OUTSIDE_ERRORS_MODULES = {
    "PostFailed": "status/alerts/webhook.py: the alerts' own, caught by their outbox (a failed post is retried)",
    "MigrationError": "schema/migrate.py: the schema package's only exception, beside the only code that raises it",
    "NotAcceptable": "service/encode.py: imported by the client and the benches, which must not need Starlette",
    "ServiceError": "service/client.py: the client's side of the translation, an answer back to an exception",
}

_BUILTIN_EXCEPTIONS = {
    name for name, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
}


def _classes() -> list[tuple[str, str, list[str]]]:
    """(module path inside the package, class name, base names) of every class the package defines."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        inside = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                found.append((inside, node.name, bases))
    return found


def exception_classes() -> list[tuple[str, str]]:
    """(module path, name) of every class deriving, through the package's own classes, from a builtin exception or
    from a library's (a base named ...Error or ...Exception)."""
    classes = _classes()
    known = set(_BUILTIN_EXCEPTIONS)
    grew = True
    while grew:
        grew = False
        for _, name, bases in classes:
            if name not in known and any(b in known or b.endswith(("Error", "Exception")) for b in bases):
                known.add(name)
                grew = True
    return [(inside, name) for inside, name, _ in classes if name in known]


def test_the_scan_sees_the_package_exceptions():
    found = dict((name, inside) for inside, name in exception_classes())
    assert found["LakehouseError"] == "core/errors.py"
    assert found["LifecycleRefused"] == "lifecycle/errors.py"  # a subclass of a subclass (FlipRefused)
    assert found["BadValue"] == "sources/errors.py"  # a builtin's subclass (ValueError)
    assert len(found) > 40


def test_no_two_exception_classes_share_a_name():
    where: dict[str, list[str]] = {}
    for inside, name in exception_classes():
        where.setdefault(name, []).append(inside)
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"exception classes sharing a name (give each a name that says whose it is): {shared}"


def test_every_exception_class_is_in_an_errors_module_or_says_why_not():
    outside = {
        name: inside
        for inside, name in exception_classes()
        if Path(inside).name != "errors.py" and name not in OUTSIDE_ERRORS_MODULES
    }
    assert not outside, (
        "exception classes defined outside their package's errors.py: move them there, or add them to "
        f"OUTSIDE_ERRORS_MODULES with why: {outside}"
    )


def test_the_allow_list_names_classes_that_exist():
    names = {name for _, name in exception_classes()}
    gone = sorted(set(OUTSIDE_ERRORS_MODULES) - names)
    assert not gone, f"OUTSIDE_ERRORS_MODULES names exception classes the package no longer has: {gone}"


def test_the_allow_list_names_only_classes_still_outside_an_errors_module():
    """A class moved into its errors.py needs no reason any more: its entry would excuse a later move back."""
    moved = sorted(
        name
        for inside, name in exception_classes()
        if name in OUTSIDE_ERRORS_MODULES and Path(inside).name == "errors.py"
    )
    assert not moved, f"OUTSIDE_ERRORS_MODULES names classes now in an errors.py (remove their entries): {moved}"
