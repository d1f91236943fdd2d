"""The CLI's verbs follow the capabilities (issue 45): `flags`/`write-flags` keep the runbooks' own verbs (list, set,
clear, history, flip), and the ones that hung there by accident are top-level verbs of their own (`reverse`,
`complete`, `backfill`, `candidates`, `soak`, `pg-readers`). Their old paths stay one release as aliases: the same
arguments, handler and exit code, one deprecation line on stderr, absent from the old group's --help and
did-you-mean. Nothing the package prints (nor a page of the docs) names an old path but the alias table."""

from __future__ import annotations

import argparse
import json
import re
import uuid
from pathlib import Path

import pytest

from lakehouse_dagster.cli.main import VERBS, build_parser, main
from lakehouse_dagster.cli.moved import MOVED, REMOVED_IN, _Noted, deprecation_line

ROOT = Path(__file__).resolve().parents[1]
NEW_VERBS = ("reverse", "complete", "backfill", "candidates", "soak", "pg-readers")
RUNBOOK_ACTIONS = ["list", "set", "clear", "history", "flip"]
UNKNOWN = str(uuid.UUID(int=7))

# An old path as it may be written: in a command or a message, a string split over lines, or argv words
OLD_FORM = re.compile(
    r"write-flags(?:[\s\"'+]|\\n)*(?:reverse|complete|backfill|candidates)\b"
    r"|(?<![\w-])flags(?:[\s\"'+]|\\n)*(?:soak|readers)\b"
    r"|write-flags (?:[a-z]+\\?\|)+(?:reverse|complete|backfill|candidates)\b"  # a synopsis: `list\|…\|backfill`
    r"|(?<![\w-])flags (?:[a-z]+\\?\|)+(?:soak|readers)\b"
)
# The one page that may name the old paths: the operator guide's table of what moved where, until 0.26.0
MAPPING = ("docs/operator-guide.md", "### Verbs by capability")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the subcommand table on this private-by-convention attribute
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _at(path: tuple[str, ...] | list[str]) -> argparse.ArgumentParser:
    parser = build_parser([path[0]])
    for word in path:
        parser = _subparsers(parser)[word]
    return parser


def _leaves(parser: argparse.ArgumentParser, path: list[str]):
    children = _subparsers(parser)
    if not children:
        yield path, parser
    for name, child in children.items():
        yield from _leaves(child, [*path, name])


def _arguments(parser: argparse.ArgumentParser) -> list[tuple]:
    return [(tuple(a.option_strings), a.dest, a.nargs, a.default, a.required) for a in parser._actions]


# --- the verbs themselves -------------------------------------------------------------------------------------


def test_the_new_verbs_are_in_the_verb_table_and_top_level_help(capsys):
    assert set(NEW_VERBS) <= set(VERBS)
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.findall(r"^    (\S+)", capsys.readouterr().out, flags=re.MULTILINE)
    assert set(NEW_VERBS) <= set(listed)


def test_the_new_verbs_run(settings, lh):
    """Each new verb through its read-only path on a fresh database (the suites of each capability run the rest)."""
    assert json.loads(lh("soak", "show", "--json", check=True)[1])["soak"]["seconds"] == 0
    code, out, err = lh("soak", "set", "5", "--note", "test", check=True)
    assert "soak: nothing stored → 5 s" in out and err == ""
    assert json.loads(lh("pg-readers", "list", "--json", check=True)[1]) == []
    assert json.loads(lh("candidates", "--json", check=True)[1]) == []
    assert json.loads(lh("reverse", "history", "--json", check=True)[1]) == {"history": []}
    assert json.loads(lh("reverse", "status", "--json", check=True)[1]) == {"datasets": []}
    assert json.loads(lh("complete", "--status", "--json", check=True)[1]) == {"marks": [], "audit": []}
    code, _, err = lh("backfill", "--dataset", UNKNOWN)
    assert code == 3 and err.startswith("lakehouse backfill: error:"), err


# --- the aliases ----------------------------------------------------------------------------------------------

# old argv -> new argv: the read-only paths (the same output from both) and an error of each kind (the same code)
ALIASED = [
    (["write-flags", "reverse", "history", "--json"], ["reverse", "history", "--json"]),
    (["write-flags", "reverse", "sync", "--full"], ["reverse", "sync", "--full"]),  # bad input: exit 2
    (["write-flags", "complete", "--status", "--json"], ["complete", "--status", "--json"]),
    (["write-flags", "complete", "--status", "--workspace", UNKNOWN], ["complete", "--status", "--workspace", UNKNOWN]),
    (["write-flags", "backfill", "--dataset", UNKNOWN], ["backfill", "--dataset", UNKNOWN]),  # not found: exit 3
    (["write-flags", "candidates", "--json"], ["candidates", "--json"]),
    (["flags", "soak", "show", "--json"], ["soak", "show", "--json"]),
    (["flags", "readers", "list", "--json"], ["pg-readers", "list", "--json"]),
]


@pytest.mark.parametrize("old, new", ALIASED, ids=lambda argv: " ".join(argv))
def test_an_alias_runs_as_its_new_verb_with_one_deprecation_line(settings, lh, old, new):
    new_code, new_out, new_err = lh(*new)
    old_code, old_out, old_err = lh(*old)
    assert old_code == new_code and old_out == new_out
    note, *rest = old_err.splitlines()
    words = [w for w in old if not w.startswith("-") and w != UNKNOWN]
    moved = [w for w in new if not w.startswith("-") and w != UNKNOWN]
    assert note == deprecation_line(words, moved)
    assert (
        note
        == f"note: `lakehouse {' '.join(words)}` is now `lakehouse {' '.join(moved)}`; the old form goes in {REMOVED_IN}"
    )
    # an error line names the verb given (its prefix), the rest is the same
    assert [line.replace(f"lakehouse {old[0]}:", "lakehouse ·:") for line in rest] == [
        line.replace(f"lakehouse {new[0]}:", "lakehouse ·:") for line in new_err.splitlines()
    ]
    assert sum("is now `lakehouse" in line for line in old_err.splitlines()) == 1


def test_every_path_under_an_alias_takes_the_new_verbs_arguments_and_names_it():
    """Static, over the whole tree: each alias leaf has its new verb's arguments and a handler noting the move."""
    checked = 0
    for (group, verb), new in MOVED.items():
        alias = _subparsers(_at([group]))[verb]
        for path, leaf in _leaves(alias, [group, verb]):
            target = [*new, *path[2:]]
            twin = _at(target)
            assert _arguments(leaf) == _arguments(twin), path
            func = leaf.get_default("func")
            assert isinstance(func, _Noted) and func.func is twin.get_default("func"), path
            assert func.line == deprecation_line(path, target)
            checked += 1
    assert checked >= 15  # reverse's 7, complete, backfill, candidates, soak's 2, pg-readers' 3


@pytest.mark.parametrize("group", ["flags", "write-flags"])
def test_the_old_groups_help_lists_only_the_runbooks_verbs(group, capsys):
    with pytest.raises(SystemExit):
        main([group, "--help"])
    listed = re.findall(r"^    (\S+)", capsys.readouterr().out, flags=re.MULTILINE)
    assert listed == RUNBOOK_ACTIONS


def test_a_mistyped_old_path_is_told_the_new_verb_and_the_list_names_none_of_the_old(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["write-flags", "candidate"])
    assert exit_.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert "(choose from 'list', 'set', 'clear', 'history', 'flip')" in first
    assert "did you mean lakehouse candidates?" in first
    with pytest.raises(SystemExit):
        main(["flags", "reader"])
    assert "did you mean lakehouse pg-readers?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, near",
    [(["revrese"], "reverse"), (["pg-reader"], "pg-readers"), (["compelte"], "complete"), (["soka"], "soak")],
)
def test_a_mistyped_new_verb_gets_the_nearest_one(argv, near, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    assert f"did you mean {near}?" in capsys.readouterr().err


# --- nothing names an old path but the alias table -------------------------------------------------------------


def _texts() -> list[Path]:
    package = [p for p in (ROOT / "lakehouse_dagster").rglob("*") if p.suffix in (".py", ".md", ".yaml", ".html")]
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.py")]
    return [p for p in package + pages if p.name != "moved.py"]  # migrations (.sql) are history, checksummed


def _without_the_mapping(path: Path, text: str) -> str:
    """The text, with the mapping section's lines blanked (line numbers kept)."""
    if str(path.relative_to(ROOT)) != MAPPING[0]:
        return text
    head, rest = text.split(MAPPING[1], 1)
    section, tail = rest.split("\n#", 1)
    return head + re.sub(r"[^\n]", " ", MAPPING[1] + section) + "\n#" + tail


def test_no_message_or_page_names_an_old_path():
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for path in _texts()
        for text in [_without_the_mapping(path, path.read_text(errors="replace"))]
        for m in OLD_FORM.finditer(text)
    ]
    assert not found, "old verb paths (now aliases, cli/moved.py) named:\n" + "\n".join(found)


def test_the_old_path_scan_sees_what_it_should():
    said = [
        "lakehouse write-flags reverse on --dataset <id>",
        '"(lakehouse write-flags "\n    "backfill --dataset <id>)"',
        "`flags soak show`",
        "lakehouse flags readers add x",
        "| `lakehouse write-flags list\\|set\\|clear\\|history\\|flip\\|candidates\\|backfill` |",
        "`lakehouse flags list|soak`",
    ]
    assert all(OLD_FORM.search(s) for s in said), [s for s in said if not OLD_FORM.search(s)]
    fine = ["lakehouse write-flags set sync.full pg", "lakehouse soak show", "write-flags flip", "pg-readers list"]
    fine.append("| `lakehouse write-flags list\\|set\\|clear\\|history\\|flip` | the writer runbook's flag verbs |")
    assert not any(OLD_FORM.search(s) for s in fine), [s for s in fine if OLD_FORM.search(s)]
    guide = ROOT / MAPPING[0]
    assert OLD_FORM.search(guide.read_text()) and not OLD_FORM.search(_without_the_mapping(guide, guide.read_text()))
