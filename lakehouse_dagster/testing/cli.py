"""`lakehouse ...` for the tests: in this process by default, as a subprocess when the process itself is the point.

A subprocess costs the interpreter's start-up and a verb's imports (0.3-3 s on a loaded machine); ~150 CLI calls of
the suite spent minutes on it. ``run_cli`` calls ``cli.main.main`` with the argv and gives what the subprocess gave:
the exit code (``SystemExit`` from argparse included, an uncaught exception as exit 1 with its traceback on stderr),
stdout and stderr as text, stdin from ``input``, the environment the subprocess saw (``os.environ`` plus ``env``,
put back afterwards; settings are read from it per call, ``Context`` caches nothing across calls). One difference
is left: a record of a logger nobody configured goes to pytest's log capture here, where a fresh process prints it
on stderr (Python's last-resort handler, WARNING and above). A run armed with a failpoint
(``LAKEHOUSE_FAILPOINT``: the process may be killed on purpose) or asked for with ``process=True`` is a real
process, as are the tests of exit codes through the shell, signals and start-up.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping

FAILPOINT_ENV = "LAKEHOUSE_FAILPOINT"  # core/failpoints.ENV (not imported: the helper loads nothing of the package)


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = 120,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``lakehouse *args``; ``env`` adds to (or overrides) the test's environment for this call only."""
    argv = [str(a) for a in args]
    if process or {**os.environ, **(env or {})}.get(FAILPOINT_ENV):
        return run_cli_process(*argv, env=env, input=input, timeout=timeout)
    out, err = io.StringIO(), io.StringIO()
    with _environ(env), _stdin(input), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _main(argv)
    return _completed(argv, code, out.getvalue(), err.getvalue())


def run_cli_process(
    *args: str, env: Mapping[str, str] | None = None, input: str | None = None, timeout: float | None = 120
) -> subprocess.CompletedProcess[str]:
    """``lakehouse *args`` as users run it: a separate process seeing the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        input=input,
        timeout=timeout,
    )


def _main(argv: list[str]) -> int:
    from lakehouse_dagster.cli.main import main  # lazy: at each call, so a test's monkeypatch of main is seen

    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors (2) and --help (0)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # the interpreter's way: the traceback on stderr, exit 1
        traceback.print_exc()
        return 1


def _completed(argv: list[str], code: int, out: str, err: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["lakehouse", *argv], code, out, err)


@contextlib.contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _stdin(text: str | None) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text or "")
    try:
        yield
    finally:
        sys.stdin = saved
