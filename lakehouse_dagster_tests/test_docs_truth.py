"""The docs cannot drift from the product (issue 44): every module is named on the architecture page, every
repository file a page cites exists, every `lakehouse …` command a page shows parses with the CLI's own parser (and
its verb path's --help answers) and the known limits link to the benchmarks for their figures instead of repeating
them. (The configuration reference's settings tables are written from core/settings/: test_settings_doc.py.)

Pure file parsing and the CLI's parser in-process (the static verb table builds one verb's parser at a time, no
heavy import): no database, no Dagster, no subprocess."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from lakehouse_dagster.cli.main import VERBS, build_parser

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakehouse_dagster"
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]  # CHANGELOG.md is history: it names files of its day


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _repository_files() -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {name for name in listed if (ROOT / name).exists()}


FILES = _repository_files()
DIRECTORIES = {str(Path(name).parent) for name in FILES} | {
    str(parent) for name in FILES for parent in Path(name).parents
}


# --- every module is named on the architecture page ----------------------------------------------------------


def _package_rows() -> dict[str, str]:
    """The 'One line per package' table: package path (`cli/`, `dagster/launcher/`) → the row's text."""
    text = (DOCS / "architecture.md").read_text()
    rows = re.findall(r"^\| `([a-z_/]+/)` \| (.*) \|$", text, flags=re.MULTILINE)
    return dict(rows)


def test_every_module_is_named_in_its_packages_row_of_the_architecture_page():
    rows = _package_rows()
    assert "core/" in rows and "cli/" in rows, "architecture.md lost its 'One line per package' table"
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        inside = path.relative_to(PACKAGE).as_posix()
        package = max((p for p in rows if inside.startswith(p)), key=len, default=None)
        row = rows.get(package, "") if package else ""
        named = re.search(rf"(?<![\w]){re.escape(path.name)}\b", row) or f"`{path.stem}`" in row
        if not named:
            unnamed.append(f"lakehouse_dagster/{inside} (row {package or 'missing'})")
    assert not unnamed, "modules the architecture page's 'One line per package' table does not name:\n" + "\n".join(
        unnamed
    )


# --- every repository file a page cites exists ----------------------------------------------------------------

_ROOTS = ("lakehouse_dagster/", "lakehouse_dagster_tests/", "bench/", "scripts/", "deploy/", "docs/", "examples/")
_EXTENSIONS = (".py", ".sql", ".md", ".yaml", ".yml", ".toml", ".json", ".sh", ".ts")
_PLACEHOLDER = re.compile(r"[<>*…{}$]|NNNN|\.\.\.")


def _cited_paths(page: Path) -> list[str]:
    """Backticked paths and relative link targets that name a file or directory of the repository."""
    text = page.read_text()
    spans = re.findall(r"`([^`\s]+)`", text)
    links = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    cited = []
    for raw in spans:
        token = raw.rstrip(".,;:")
        if _PLACEHOLDER.search(token) or token.startswith((".", "/", "~", "http")) or re.match(r"[A-Z_]+/", token):
            continue
        if token.startswith(_ROOTS) or ("/" in token and token.endswith(_EXTENSIONS)):
            cited.append(token)
        elif "/" not in token and token.endswith(".py"):
            cited.append(token)
    for target in links:
        if target and not target.startswith(("#", "/", "mailto:")):  # "/runs/…": the UI's address, not a file
            resolved = (page.parent / target).resolve()
            cited.append(str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else target)
    return cited


def _exists(cited: str) -> bool:
    """A path from the root, or from the package (the glossary's and the architecture page's paths are under
    `lakehouse_dagster/`), or the tail of one (`defs/mirror/assets.py`); a bare file name anywhere."""
    path = cited.rstrip("/")
    if "/" not in path:
        return any(Path(name).name == path for name in FILES) or path in DIRECTORIES
    return any(name == path or name.endswith("/" + path) for name in FILES) or any(
        d == path or d.endswith("/" + path) for d in DIRECTORIES
    )


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_file_a_page_cites_exists(page):
    missing = sorted({c for c in _cited_paths(page) if not _exists(c)})
    assert not missing, f"{_rel(page)} cites files the repository does not hold: {missing}"


# Documents the project was built from that are not in the repository: a reader of the code cannot open them, so
# nothing cites them as if it could (say what they say instead).
OUTSIDE = ("FIELD-NOTES", "seeds/", "DESIGN.md")


def test_no_file_cites_a_document_kept_outside_the_repository():
    citing = sorted(
        f"{name}: {word}"
        for name in FILES
        if name.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".sh")) and name != _rel(Path(__file__))
        for word in OUTSIDE
        if word in (ROOT / name).read_text(errors="replace")
    )
    assert not citing, f"files citing documents that are not in the repository: {citing}"


def test_nothing_sends_the_operator_to_a_plots_tab_dagster_does_not_have():
    """Dagster 1.13 draws numeric metadata under the asset page's Metadata section, its Table | Plots toggle set to
    Plots; there is no Plots tab (and `?view=plots` is a blank page)."""
    said = sorted(
        name
        for name in FILES
        if name.endswith((".py", ".md")) and name != _rel(Path(__file__))
        for text in [(ROOT / name).read_text(errors="replace")]
        if re.search(r"(?<!no )(?:the|its|asset's) \**Plots\** tab|view=plots(?!` opens a blank)", text)
    )
    assert not said, f"these send the operator to a Plots tab Dagster 1.13 does not have: {said}"


def test_the_citation_scan_sees_what_it_should():
    """If the scan stopped finding citations it would pass on anything."""
    cited = _cited_paths(DOCS / "glossary.md")
    assert "runbooks/flip.py" in cited and "runbooks/first_sync.py" in cited
    assert not _exists("schema/sync_log_sql.py") and _exists("mirror/sync.py") and _exists("test_launcher.py")


# --- every `lakehouse …` command parses ------------------------------------------------------------------------

# Commands a page shows on purpose as wrong (the did-you-mean examples): they must stay wrong.
MEANT_WRONG = {"lakehouse flgas list", "lakehouse flags set … --worksapce w"}

# A placeholder's stand-in, by what the placeholder names.
_UUID = "0bdc46bb-b7a8-56d7-a911-657c022adc1d"
_STAND_INS = {
    "$r": "export.stream",
    "<reader>": "export.stream",
    "<writer>": "sync.full",
    "<seconds>": "60",
    "<dir>": "/tmp/export",
    "'<json>'": "{}",
    "<json>": "{}",
    "JSON": "{}",
    "FILE": "examples/rollout-graph-kuzu.yaml",
    "plan.yaml": "examples/rollout-graph-kuzu.yaml",
    "N": "5",
    "S": "60",
    "ID": _UUID,
}
_ELIDED = ("…", "...")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    fenced: bool  # a line of a code block: parsed whole; an inline span names a verb path and its options only

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _commands(page: Path) -> list[Command]:
    found = []
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            body = line.strip()
            body = re.sub(r"^(?:for .*; do|do|then)\s+", "", body)
            if re.match(r"lakehouse [a-z]", body):  # output lines ("lakehouse up: ready …") do not start with a verb
                for segment in re.split(r"\s&&\s|\s\|\|\s|;\s", _uncomment(body)):
                    if re.match(r"lakehouse [a-z][a-z-]*(\s|$)", segment.strip()):
                        found.append(Command(_rel(page), number, segment.strip(), True))
        else:
            for span in re.findall(r"`(lakehouse [^`]+)`", line):
                if re.match(r"lakehouse [a-z][a-z-]*(:|$|\s)", span) and not re.match(r"lakehouse [a-z-]+:", span):
                    found.append(Command(_rel(page), number, span.replace("\\|", "|"), False))
    return found


def _uncomment(line: str) -> str:
    """The line without its shell comment (a '#' that starts a word outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


ALL_COMMANDS = [c for page in PAGES for c in _commands(page)]


@functools.cache
def _parser(verb: str) -> argparse.ArgumentParser:
    """The CLI's parser with this verb built whole (as `lakehouse <verb> …` builds it), made once."""
    return build_parser([verb])


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the subcommand table on this private-by-convention attribute
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _positional_choices(parser: argparse.ArgumentParser) -> set[str]:
    return {str(c) for a in parser._actions if not a.option_strings and a.choices for c in a.choices}


def _alternatives(token: str) -> list[str]:
    """`[--dataset|--workspace]` → both; `auto|full` → both; brackets dropped."""
    return [t.strip("[]()") for t in token.split("|") if t.strip("[]()")]


def _verb_paths(words: list[str]) -> tuple[list[list[str]], list[str]]:
    """The verb paths the words name (each alternative of `seed|status` its own) with the parser of each, and
    the problems found walking them: a word that is no subcommand where one is expected."""
    problems: list[str] = []
    paths: list[list[str]] = [[]]
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    if not words or words[0] not in VERBS:
        return [], [f"no verb {words[0] if words else '(none)'!r} (verbs: {', '.join(VERBS)})"]
    root = _parser(words[0])
    parsers[()] = root
    for word in words:
        if word.startswith(("-", "[", "<", "$")) or word in _ELIDED:
            break
        grown = []
        for path in paths:
            children = _subparsers(parsers[tuple(path)])
            if not children:
                grown.append(path)
                continue
            for alternative in _alternatives(word):
                if alternative in children:
                    parsers[(*path, alternative)] = children[alternative]
                    grown.append([*path, alternative])
                elif alternative not in _positional_choices(parsers[tuple(path)]):
                    problems.append(f"{' '.join(['lakehouse', *path])} has no subcommand {alternative!r}")
        if grown == paths:
            break
        paths = grown
    return paths, problems


def _help_answers(path: list[str]) -> str | None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            _parser(path[0]).parse_args([*path, "--help"])
        except SystemExit as exc:
            return None if exc.code == 0 else out.getvalue().strip()
    return "--help did not exit"


def _parse_error(argv: list[str]) -> str | None:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            _parser(argv[0]).parse_args(argv)
        except SystemExit as exc:
            return err.getvalue().strip() or f"exit {exc.code}"
    return None


def _stand_in(token: str) -> str:
    if token in _STAND_INS:
        return _STAND_INS[token]
    if re.fullmatch(r"\$[A-Z]+|<[a-z-]+>", token):
        return _UUID  # $CUST, $CRM, $WS, <uuid>, <id>, <dataset>
    return token


def _variants(words: list[str]) -> list[list[str]]:
    """The command lines a synopsis stands for: every alternative of every `a|b`, optional groups included."""
    choices = []
    for word in words:
        if word.startswith("[") and not word.endswith("]") or word.endswith("]") and not word.startswith("["):
            word = word.strip("[]")  # a group spread over words: `[--dataset <uuid>]`
        choices.append([_stand_in(w) for w in _alternatives(word)] if "|" in word else [_stand_in(word.strip("[]"))])
    return [list(v) for v in itertools.islice(itertools.product(*choices), 64)]


def check(command: Command) -> list[str]:
    """What is wrong with the command as the page shows it (empty: nothing)."""
    words = shlex.split(command.text)[1:]
    paths, problems = _verb_paths(words)
    for path in paths:
        answer = _help_answers(path)
        if answer is not None:
            problems.append(f"lakehouse {' '.join(path)} --help: {answer}")
        parser = _parser(path[0])
        for word in path:
            parser = _subparsers(parser)[word]
        known = _options(parser)
        for word in words:
            for option in _alternatives(word):
                name = option.split("=", 1)[0]
                if name.startswith("--") and name not in known:
                    problems.append(f"lakehouse {' '.join(path)} has no option {name}")
    if problems or not command.fenced or any(e in command.text for e in _ELIDED):
        return problems
    for argv in _variants(words):
        error = _parse_error(argv)
        if error is not None:
            problems.append(f"`lakehouse {shlex.join(argv)}` does not parse: {error.splitlines()[0]}")
    return problems


def test_the_command_scan_finds_the_walkthroughs_commands():
    texts = {c.text for c in ALL_COMMANDS}
    assert 'lakehouse flags flip export.stream --dataset $CUST --note "fase1 canary"' in texts
    assert "lakehouse sync --dataset $CRM" in texts and "lakehouse canary --smoke --dataset $CRM" in texts
    assert MEANT_WRONG <= texts
    assert len(ALL_COMMANDS) > 150


@pytest.mark.parametrize("text", sorted(MEANT_WRONG))
def test_the_commands_shown_as_typos_stay_wrong(text):
    assert check(Command("-", 0, text, False)), f"{text} is shown as a typo the CLI refuses, but it is accepted"


@pytest.mark.parametrize(
    "text, fenced",
    [
        ("lakehouse adopt", False),  # no such verb
        ("lakehouse soak sett 60", False),  # no such subcommand
        ("lakehouse sync --datset $CRM", True),  # no such option
        ("lakehouse flags flip --dataset $CRM", True),  # the reader is missing: parsed whole in a code block
        ("lakehouse sync --mode fast --dataset <uuid>", True),  # not a choice
    ],
)
def test_the_check_refuses_what_the_cli_refuses(text, fenced):
    assert check(Command("-", 0, text, fenced)), text


def test_every_lakehouse_command_in_the_docs_parses():
    wrong = [
        f"{c}\n    " + "\n    ".join(problems)
        for c in ALL_COMMANDS
        if c.text not in MEANT_WRONG
        for problems in [check(c)]
        if problems
    ]
    assert not wrong, f"{len(wrong)} command(s) in the docs the CLI would refuse:\n" + "\n".join(wrong)


# --- limits.md links its figures to the benchmarks -------------------------------------------------------------

# A measured figure: a ratio, a duration below a second's precision or with a decimal, a range, an approximation,
# a size. A whole number of seconds (`30 s`) is a setting or a timeout the code holds, not a measurement.
_FIGURE = re.compile(
    r"~\s?\d[\d,.]*\s?(?:µs|ms|s|×|%|MB|GB|KB)?(?![\w])"
    r"|\d[\d,]*(?:\.\d+)?\s?(?:–\s?\d[\d,]*(?:\.\d+)?)\s?(?:µs|ms|s|×|%|MB|GB|KB)(?![\w])"
    r"|\d[\d,]*\.\d+\s?(?:µs|ms|s|×|%|MB|GB|KB)(?![\w])"
    r"|\d[\d,]*\s?(?:µs|ms|×|%|MB|GB|KB)(?![\w])"
)


def _anchors(page: Path) -> set[str]:
    """The ids mkdocs' toc extension gives the page's headings (its default slugify, over the heading's text)."""
    headings = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.MULTILINE)
    return {slugify(heading.replace("`", ""), "-") for heading in headings}


def test_limits_repeat_no_figure_and_link_each_to_its_benchmarks_section():
    text = (DOCS / "limits.md").read_text()
    figures = sorted({m.group(0).strip() for m in _FIGURE.finditer(text)})
    assert not figures, (
        "docs/limits.md repeats measured figures; say the limit in words and link its benchmarks section "
        f"(benchmarks.md#…): {figures}"
    )
    anchors = _anchors(DOCS / "benchmarks.md")
    linked = re.findall(r"\]\(benchmarks\.md#([^)]+)\)", text)
    assert linked, "docs/limits.md links no benchmarks section"
    broken = sorted(set(linked) - anchors)
    assert not broken, f"docs/limits.md links benchmarks sections that do not exist: {broken}"


def test_the_readmes_links_into_the_docs_land_on_a_heading():
    """mkdocs checks the anchors of links between pages; the README is outside the site, so it is checked here."""
    links = re.findall(r"\]\((docs/[^)#\s]+\.md)#([^)\s]+)\)", (ROOT / "README.md").read_text())
    broken = [f"{page}#{anchor}" for page, anchor in links if anchor not in _anchors(ROOT / page)]
    assert not broken, f"README.md links to headings that do not exist: {broken}"


def test_the_figure_pattern_tells_measurements_from_settings():
    measured = ["~4.5 s", "0.60×", "20–70 ms", "395 MB", "~50 µs", "1.4 s", "2.9–3.9×", "16 %"]
    settings = ["30 s", "100 rows", "15 minutes", "2,000 per kind", "4,096-row bucket", "G1–G4"]
    assert all(_FIGURE.search(f) for f in measured), [f for f in measured if not _FIGURE.search(f)]
    assert not any(_FIGURE.search(s) for s in settings), [s for s in settings if _FIGURE.search(s)]
