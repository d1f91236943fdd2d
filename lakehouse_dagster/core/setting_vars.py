"""How one setting is declared: its variable, type, default, bounds and meaning, written once.

A declaration is a dataclass field of a section of core/settings/ whose metadata holds a ``Var``. ``read_section``
reads a section's variables from the environment (a bad value refused in one line naming the variable, the value
and what to set), and core/settings_doc.py writes docs/configuration.md's tables from the same declarations, so the
page cannot drift from what is read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from lakehouse_dagster.core.errors import BadInput

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Bound:
    """A rule a value must keep beyond its type: ``text`` for the docs, ``check`` raises BadInput naming the variable."""

    text: str
    check: Callable[[str, Any], None]


def at_least(minimum: int) -> Bound:
    def check(name: str, value: Any) -> None:
        if value < minimum:
            raise BadInput(f"{name}={value} is below the minimum {minimum}")

    return Bound(f"≥ {minimum}", check)


def _above_zero(name: str, value: Any) -> None:
    if not value > 0:
        raise BadInput(f"{name}={value} must be above 0")


def _share(name: str, value: Any) -> None:
    if not 0.0 < value <= 1.0:
        raise BadInput(f"{name}={value} is not a share of the time; set it above 0 and at most 1 (back to back)")


def _fraction(name: str, value: Any) -> None:
    if not 0.0 <= value <= 1.0:
        raise BadInput(f"{name}={value} is not a fraction; set it from 0 (never) to 1 (every read)")


ABOVE_ZERO = Bound("> 0", _above_zero)
SHARE = Bound("> 0, ≤ 1", _share)
FRACTION = Bound("0 to 1", _fraction)


def one_of(*choices: str) -> Bound:
    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise BadInput(f"{name}={value!r} is not supported; use {' or '.join(choices)}")

    return Bound(" or ".join(f"`{c}`" for c in choices), check)


def zero_or_at_least(minimum: int, why: str, zero: str) -> Bound:
    """0 turns the feature off (``zero`` says how); otherwise at least ``minimum``, ``why`` saying why."""

    def check(name: str, value: Any) -> None:
        if value < 0:
            raise BadInput(f"{name}={value} is below the minimum 0")
        if 0 < value < minimum:
            raise BadInput(f"{name}={value} is below {minimum}{why}; set it to 0 ({zero}) or {minimum} or more")

    return Bound(f"0 or ≥ {minimum}", check)


@dataclasses.dataclass(frozen=True)
class Var:
    """One environment variable and what it means (the docs' row)."""

    env: str
    kind: str  # int, float, bool, str, lower (a lower-cased str), path, or custom (``parse`` given)
    meaning: str
    bound: Bound | None = None
    shown_default: str | None = None  # the docs' default when the value is computed (a path, the OS user)
    also: tuple[str, ...] = ()  # read, in order, when ``env`` is unset or empty (AWS_DEFAULT_REGION)
    parse: Callable[[str, str], Any] | None = None  # (variable, raw text) -> value, for kind "custom"
    secret: bool = False  # never in a repr, a log or a message

    @property
    def names(self) -> tuple[str, ...]:
        return (self.env, *self.also)


def setting(
    env: str,
    default: Any,
    meaning: str,
    *,
    kind: str | None = None,
    bound: Bound | None = None,
    shown: str | None = None,
    also: tuple[str, ...] = (),
    parse: Callable[[str, str], Any] | None = None,
    factory: Callable[[], Any] | None = None,
    secret: bool = False,
) -> Any:
    """A section's field read from ``env``: ``default`` (or ``factory()``) when unset or empty. An int is at least 0
    unless ``bound`` says otherwise; a float is any number unless it says."""
    if kind is None:
        kind = "custom" if parse else _kind_of(default)
    if kind == "int" and bound is None:
        bound = at_least(0)
    var = Var(env, kind, meaning, bound, shown, also, parse, secret)
    if factory is not None:
        return dataclasses.field(default_factory=factory, repr=not secret, metadata={"var": var})
    return dataclasses.field(default=default, repr=not secret, metadata={"var": var})


def given(env: str) -> Any:
    """A field saying whether ``env`` is set (non-empty) in this process' environment, not a variable of its own."""
    return dataclasses.field(default=False, metadata={"given": env})


def _kind_of(default: Any) -> str:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    return "str"


def _parse(var: Var, raw: str, default: Any) -> Any:
    name = var.env
    if var.kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise BadInput(f"{name}={raw!r} is not an integer; set it to a whole number (default {default})") from None
    if var.kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise BadInput(f"{name}={raw!r} is not a number (default {default})") from None
    if var.kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise BadInput(f"{name}={raw!r} is not a boolean; use true or false")
    if var.kind == "lower":
        return raw.lower()
    if var.kind == "path":
        return Path(raw).expanduser().resolve()
    if var.parse is not None:
        return var.parse(name, raw)
    return raw


def read(field: dataclasses.Field, environ: Mapping[str, str] | None = None) -> Any:
    """The field's value from the environment: the first of its variables set non-empty, else its default."""
    environ = os.environ if environ is None else environ
    var: Var = field.metadata["var"]
    default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    raw = next((environ[n] for n in var.names if environ.get(n)), None)
    value = default if raw is None else _parse(var, raw, default)
    if var.bound is not None and value is not None:
        var.bound.check(var.env, value)
    return value


def read_section(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if "var" in f.metadata:
            values[f.name] = read(f, environ)
        elif "given" in f.metadata:
            values[f.name] = bool(environ.get(f.metadata["given"]))
    return cls(**values)


def read_one(cls: type, name: str) -> Any:
    """One field of a section, alone: a bad value of any other variable does not stop it."""
    return read(next(f for f in dataclasses.fields(cls) if f.name == name))


def declared(cls: type) -> list[tuple[str, Var]]:
    """(field name, declaration) of a section's variables, in declaration order."""
    return [(f.name, f.metadata["var"]) for f in dataclasses.fields(cls) if "var" in f.metadata]
