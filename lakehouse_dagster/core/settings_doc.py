"""docs/configuration.md's settings tables, written from the declarations in core/settings/ (one per section).

    python -m lakehouse_dagster.core.settings_doc            # print the tables
    python -m lakehouse_dagster.core.settings_doc --write    # rewrite them in docs/configuration.md (or a path)

The page keeps its prose; only the text between BEGIN and END is written. lakehouse_dagster_tests/test_settings_doc.py
fails when the page differs from what this writes, so a setting's meaning is edited in its declaration only.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from lakehouse_dagster.core.setting_vars import Var
from lakehouse_dagster.core.settings import sections

COMMAND = "python -m lakehouse_dagster.core.settings_doc --write"
BEGIN = f"<!-- the tables below are written by `{COMMAND}` from core/settings/: edit the declarations there -->"
END = "<!-- end of the written tables -->"
PAGE = Path("docs") / "configuration.md"


def render() -> str:
    """The tables, one per section, in the order of ``Settings``' fields."""
    out: list[str] = []
    for name, cls in sections().items():
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        out += [
            f"### `settings.{name}`",
            "",
            summary,
            "",
            "| variable | default | allowed | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for field in dataclasses.fields(cls):
            var: Var | None = field.metadata.get("var")
            if var is not None:
                names = " / ".join(f"`{n}`" for n in var.names)
                out.append(f"| {names} | {_default(var, field)} | {_allowed(var)} | {var.meaning} |")
        out.append("")
    return "\n".join(out)


def _default(var: Var, field: dataclasses.Field) -> str:
    if var.shown_default is not None:
        return var.shown_default
    value: Any = field.default
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _allowed(var: Var) -> str:
    if var.bound is not None:
        return var.bound.text
    return {"bool": "true or false", "float": "a number"}.get(var.kind, "—")


def rewritten(page: str) -> str:
    """The page with its written part replaced by ``render()``."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"the page has lost its markers; put back the lines\n{BEGIN}\n{END}")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{render()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        path = Path(argv[1]) if len(argv) > 1 else PAGE
        path.write_text(rewritten(path.read_text()))
        print(f"wrote the settings tables into {path}")
        return 0
    print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
