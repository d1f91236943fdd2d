"""Every bench command the docs give still runs as written (issue 45: every figure stays reproducible with its command).

docs/*.md (docs/benchmarks.md above all) quote each figure's command, ``.venv/bin/python bench/bench_X.py --opt v``,
in code spans and code blocks. A script renamed or an option renamed since leaves a figure no one can reproduce. This
test finds every ``bench/….py`` those commands name, checks the script exists, and parses each command's arguments
with the script's own argparse parser without running the bench: one child process runs every script as
``__main__`` with ``ArgumentParser.parse_args`` replaced by one that parses (argparse's own errors for an unknown
option or a bad value) and then stops the script. Each option the doc writes must also be one of the parser's option
strings exactly, since argparse would take an abbreviation (``--row`` for ``--rows``) that a later option could make
ambiguous. A usage line (``[--only calm|store]``) is checked for its option names only. No database: nothing runs
past argument parsing (``--help``, by contrast, would exit 0 with an unknown option before it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

SCRIPT = re.compile(r"\bbench/([A-Za-z0-9_]+\.py)\b(.*)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
INDENTED = re.compile(r"^ {4,}((?:nice |\.venv/|python|bench/|LAKEHOUSE_|PYTHONPATH).*)$", re.M)
SPAN = re.compile(r"`([^`]+)`")
# where a command's arguments end: a shell comment, pipe, list, redirect, or the prose around an inline span
STOP = re.compile(r"\s#|\s\||;|&&|\s>|\)|\s\(")

# Runs in the child: each (script, args) as __main__ until its parser has parsed args, then on to the next.
CHILD = r"""
import argparse, contextlib, io, json, runpy, sys
class Parsed(BaseException):
    pass
def parse_args(self, args=None, namespace=None):
    ns = ORIGINAL(self, args, namespace)
    raise Parsed(sorted(s for s in self._option_string_actions if s.startswith("--")))
ORIGINAL = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = parse_args
out = []
for path, args in json.load(sys.stdin):
    sys.argv = [path, *args]
    err = io.StringIO()
    result = {"script": path, "args": args}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
        result["error"] = "the script ran to its end without parsing arguments"
    except Parsed as parsed:
        result["options"] = parsed.args[0]
    except SystemExit as e:
        result["error"] = (err.getvalue().strip().splitlines() or [f"exit {e.code}"])[-1]
    except Exception as e:  # an import or set-up failure before parsing
        result["error"] = f"{type(e).__name__}: {e}"
    out.append(result)
print(json.dumps(out))
"""


def _code_texts(text: str) -> list[str]:
    """Each code block line and each inline code span (joined across the line breaks of a paragraph)."""
    texts: list[str] = []
    for block in FENCE.finditer(text):
        texts.extend(block.group(0).splitlines()[1:-1])
    prose = FENCE.sub("", text)
    for span in SPAN.finditer(prose):
        texts.append(" ".join(span.group(1).split()))
    texts.extend(m.group(1) for m in INDENTED.finditer(SPAN.sub("", prose)))  # an indented code block's lines
    return texts


def doc_commands(text: str) -> list[tuple[str, str, bool]]:
    """(script file name, its argument text, usage form) for every ``bench/X.py`` named in a code text."""
    found = []
    for code in _code_texts(text):
        for m in SCRIPT.finditer(code):
            rest = m.group(2)
            usage = "[" in rest
            if not usage:
                stop = STOP.search(rest)
                rest = rest[: stop.start()] if stop else rest
            found.append((m.group(1), rest.strip(), usage))
    return found


def _options(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def parse_in_child(commands: list[tuple[str, list[str]]]) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps([[str(ROOT / "bench" / s), a] for s, a in commands]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(commands: list[tuple[str, str, str, bool]]) -> list[str]:
    """Problems, one line each, for (doc, script, argument text, usage form) commands."""
    problems: list[str] = []
    to_parse: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    usage_forms: list[tuple[str, str, list[str]]] = []
    for doc, script, rest, usage in commands:
        if script.startswith("_"):
            continue  # bench/_common.py: a module the scripts share, not a command
        if not (ROOT / "bench" / script).is_file():
            problems.append(f"{doc}: bench/{script} does not exist")
            continue
        if usage:
            usage_forms.append((doc, script, re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", rest)))
            to_parse.setdefault((script, ()), [])
        else:
            to_parse.setdefault((script, tuple(shlex.split(rest))), []).append(doc)
    results = parse_in_child([(s, list(a)) for s, a in to_parse])
    known: dict[str, list[str]] = {}
    for ((script, args), docs), result in zip(to_parse.items(), results, strict=True):
        where = ", ".join(sorted(set(docs))) or "usage line"
        if "error" in result:
            problems.append(f"{where}: bench/{script} {' '.join(args)}: {result['error']}")
            continue
        known[script] = result["options"]
        for opt in _options(list(args)):
            if opt not in result["options"]:
                problems.append(f"{where}: bench/{script}: {opt} is not one of its options (an abbreviation?)")
    for doc, script, opts in usage_forms:
        problems += [
            f"{doc}: bench/{script}: {o} is not one of its options" for o in opts if o not in known.get(script, [o])
        ]
    return problems


def all_doc_commands() -> list[tuple[str, str, str, bool]]:
    return [
        (str(md.relative_to(ROOT)), *cmd)
        for md in sorted(DOCS.rglob("*.md"))
        for cmd in doc_commands(md.read_text(encoding="utf-8"))
    ]


def test_the_docs_name_bench_commands():
    scripts = {script for _, script, _, _ in all_doc_commands()}
    assert "bench_mirror.py" in scripts and len(scripts) >= 20, scripts


def test_every_bench_command_in_the_docs_parses():
    problems = check(all_doc_commands())
    assert not problems, "bench commands in docs/ that no longer run as written:\n" + "\n".join(problems)


WRONG = [  # (a doc's text, what the check must say about it: one fragment per problem, none when it is right)
    ("`.venv/bin/python bench/bench_mirror.py --rows 1000 --skip-naive`", []),
    ("`.venv/bin/python bench/bench_mirror.py --rwos 1000`", ["unrecognized arguments: --rwos"]),
    ("`.venv/bin/python bench/bench_mirror.py --row 1000`", ["--row is not one of its options"]),
    ("`.venv/bin/python bench/bench_mirror.py --rows many`", ["invalid int value: 'many'"]),
    ("`nice .venv/bin/python bench/bench_mirorr.py`", ["bench/bench_mirorr.py does not exist"]),
    ("`.venv/bin/python bench/bench_suite_long.py [--only calm|store] [--onyl x]`", ["--onyl is not one of"]),
    ("```\n.venv/bin/python bench/bench_widen.py --datasets 10 --repaet 3   # note\n```", ["--repaet"]),
    ("Text:\n\n    .venv/bin/python bench/bench_flags.py --lookup 10\n", ["--lookup is not one of"]),
    ("(`bench/bench_stream.py --variants\n  stream,stream-rest`; the burst)", []),
]


def test_a_wrong_command_is_caught():
    """The check itself: a misspelled option, an abbreviation, a bad value, a missing script are each named."""
    problems = check([(f"case{i}.md", *cmd) for i, (text, _) in enumerate(WRONG) for cmd in doc_commands(text)])
    for i, (text, expected) in enumerate(WRONG):
        mine = [p for p in problems if p.startswith(f"case{i}.md")]
        assert len(mine) == len(expected), (text, mine)
        for problem, fragment in zip(mine, expected, strict=True):
            assert fragment in problem, (text, problem)
