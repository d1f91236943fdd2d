"""Each capability reads its own section (issue 45): a function that takes the whole ``Settings`` but reads one
section of it, and hands it on nowhere whole, takes that section instead (``plan_shards(stream: StreamSettings,
...)``, called ``plan_shards(settings.stream, ...)``), so its signature says what it depends on and a test builds
only that. Read from the source (no import): every module of the package, imported or not."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from lakehouse_dagster.core.settings import sections

PACKAGE = Path(__file__).resolve().parents[1] / "lakehouse_dagster"

# Functions kept on the whole Settings though they read one section, each with why. Keyed "module path:qualname".
ONE_SECTION_KEPT = {
    "lake/catalog.py:table_identifier": "the table's name, called at ~150 sites (tests, bench/, the crash harness, "
    "the lifecycle model) that hold a whole Settings for load_catalog beside it: narrowing it moves no boundary",
    "sources/writers.py:plan_write": "dispatches on the source's type, each type reading its own settings "
    "(files: settings.s3, postgres: none today): a new source type must not change its callers",
    "sources/writers.py:pending_source_changes": "the same dispatch on the source's type, for the source poller "
    "(sources/poll.py pending_ingests, the Dagster sensor and the lifecycle model above it)",
}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]


def _settings_param(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The parameter holding the whole Settings: annotated ``Settings`` (or ``Settings | None``), or named so."""
    for p in _params(fn):
        annotation = ast.unparse(p.annotation).strip("'\"") if p.annotation else ""
        if annotation.removesuffix(" | None").rsplit(".", 1)[-1] == "Settings" or p.arg == "settings":
            return p.arg
    return None


def _reads(fn: ast.AST, name: str) -> tuple[set[str], int]:
    """(the sections read as ``name.<section>``, how many other uses of ``name``: passed on, returned, kept...).
    A nested function or lambda with a parameter of the same name is another variable, and not looked into."""
    known = set(sections())
    read: set[str] = set()
    whole = 0

    def visit(node: ast.AST, parent: ast.AST | None) -> None:
        nonlocal whole
        if isinstance(node, ast.Name) and node.id == name:
            if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in known:
                read.add(parent.attr)
            else:
                whole += 1
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (*_FUNCTIONS, ast.Lambda)) and any(p.arg == name for p in _params(child)):
                continue
            visit(child, node)

    for statement in fn.body if isinstance(fn, _FUNCTIONS) else [fn]:
        visit(statement, None)
    return read, whole


def narrowable(tree: ast.AST) -> Iterator[tuple[str, int, str, set[str]]]:
    """(qualname, line, parameter, sections read) of every function of ``tree`` taking the whole Settings that
    reads at most one section of it and never hands it on whole."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, str, set[str]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, _FUNCTIONS):
                name = _settings_param(child)
                if name is not None:
                    read, whole = _reads(child, name)
                    if len(read) <= 1 and not whole:
                        yield f"{prefix}{child.name}", child.lineno, name, read
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _found() -> dict[str, tuple[int, str, set[str]]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        inside = path.relative_to(PACKAGE).as_posix()
        for qualname, line, param, read in narrowable(ast.parse(path.read_text(), str(path))):
            found[f"{inside}:{qualname}"] = (line, param, read)
    return found


def _what_to_do(where: str, line: int, param: str, read: set[str]) -> str:
    path, qualname = where.split(":")
    if not read:
        return f"{path}:{line} {qualname} takes {param} and reads nothing of it: drop the parameter"
    (section,) = read
    cls = sections()[section].__name__
    return (
        f"{path}:{line} {qualname} reads only {param}.{section}: take the section ({section}: {cls}, from "
        f"lakehouse_dagster.core.settings) and have its callers pass settings.{section}, or add it to "
        "ONE_SECTION_KEPT with why"
    )


def test_a_function_reads_its_own_section_not_the_whole_settings():
    found = _found()
    wrong = [_what_to_do(where, *info) for where, info in sorted(found.items()) if where not in ONE_SECTION_KEPT]
    assert not wrong, "functions taking the whole Settings to read one section of it:\n" + "\n".join(wrong)


def test_every_kept_function_still_reads_one_section():
    """An entry whose function is gone, renamed or now reads more says nothing any longer: remove it."""
    stale = sorted(set(ONE_SECTION_KEPT) - set(_found()))
    assert not stale, f"ONE_SECTION_KEPT names functions that no longer take Settings to read one section: {stale}"


def test_the_scan_tells_one_section_from_the_whole():
    """If the scan missed a case it would pass on anything; a small module of each kind."""
    source = """
def one(conn, settings: Settings, n):
    return settings.stream.shards * n + settings.stream.workers

def by_name(settings):
    return settings.mirror.batch_size

def annotated(s: "Settings | None") -> int:
    return s.sync.chunk_rows

def two(settings: Settings):
    return settings.stream.shards, settings.sync.chunk_rows

def handed_on(settings: Settings):
    return load_catalog(settings), settings.catalog.namespace

def kept(settings: Settings):
    x = settings
    return x.catalog.namespace

def unused(conn, settings: Settings):
    return conn

def replaced(settings: Settings):
    return settings.replace(sync={"chunk_rows": 3}).sync

class Holder:
    @classmethod
    def from_settings(cls, conn, settings):
        return cls(conn, settings.flags.ttl_seconds)

def outer(settings: Settings):
    def inner():
        return settings.reverse.resync_share
    return inner, settings.reverse.lag_alert_seconds

def shadowed(settings: Settings):
    f = lambda settings: settings.sync.chunk_rows
    return f, settings.shadow.sample

def section_only(stream: StreamSettings):
    return stream.shards
"""
    got = {qualname: read for qualname, _, _, read in narrowable(ast.parse(source))}
    assert got == {
        "one": {"stream"},
        "by_name": {"mirror"},
        "annotated": {"sync"},
        "unused": set(),
        "Holder.from_settings": {"flags"},
        "outer": {"reverse"},
        "shadowed": {"shadow"},
    }
    message = _what_to_do("mirror/shards.py:plan_shards", 112, "settings", {"stream"})
    assert "take the section (stream: StreamSettings" in message and "pass settings.stream" in message
