"""What `lakehouse up` relays of Dagster's foreground console (issue 33: 3,401 lines in 31 minutes, mostly noise).

By default it keeps Dagster's records at INFO and above and drops: every run's DEBUG events (STEP_OUTPUT, "Type
check passed", …; they stay in the event log, the UI shows them), Dagster's beta/preview warnings with the source
line Python prints under them (bare, or inside a Dagster record), and the sensor daemon's per-tick lines ("Checking for new runs for sensor", "No run
requests returned", "Sensor … skipped: …": the sensors page shows each tick). Anything else — a traceback, a
warning of ours, a line that is not a Dagster record — passes as it is. ``lakehouse up --debug`` relays everything.

A record's continuation lines (a multi-line message) share its fate. Only the console is filtered: nothing here
changes what Dagster stores. Colours are stripped from what is relayed (one format), and `lakehouse up` starts Dagster's
own services at WARNING (their INFO lines are per-second chatter; `--debug` restores them)."""

from __future__ import annotations

import re
import threading
from typing import IO

# "2026-12-03 12:26:22 +0000 - dagster - DEBUG - read_flip - <run id> - …" (Dagster's console format), colours
# stripped first (a terminal's colored logs).
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? [+-]\d{4} - (?P<name>\S+) - (?P<level>[A-Z]+) - ")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WARNING = re.compile(r"^\S.*:\d+: (?P<category>\w+Warning): ")
_QUIET_WARNINGS = {"BetaWarning", "PreviewWarning", "SupersessionWarning"}
_SENSOR_TICKS = (
    re.compile(r"Checking for new runs for sensor: "),
    re.compile(r"No run requests returned for \S+, skipping"),
    re.compile(r"Sensor \S+ skipped: "),
)


class ConsoleFilter:
    """Line by line: ``keep(line)`` says whether to relay it (state: the last record's fate, for its continuation
    lines)."""

    def __init__(self, *, debug: bool = False) -> None:
        self.debug = debug
        self._keeping = True
        self.dropped = 0

    def keep(self, line: str) -> bool:
        if self.debug:
            return True
        plain = _ANSI.sub("", line)
        record = _RECORD.match(plain)
        if record is not None:
            self._keeping = not self._noise(record, plain[record.end() :])
        else:
            warning = _WARNING.match(plain)
            if warning is not None:
                self._keeping = warning["category"] not in _QUIET_WARNINGS
            elif not plain[:1].isspace() and plain.strip():
                self._keeping = True  # a line of its own (not a continuation): relayed
        if not self._keeping:
            self.dropped += 1
        return self._keeping

    @staticmethod
    def _noise(record: re.Match, message: str) -> bool:
        if record["level"] == "DEBUG":
            return True
        warning = _WARNING.match(message)  # a Python warning Dagster's logging captured (the code server's)
        if warning is not None and warning["category"] in _QUIET_WARNINGS:
            return True
        return record["name"].endswith("SensorDaemon") and any(p.match(message) for p in _SENSOR_TICKS)


def plain(line: str) -> str:
    """The line without its colours: Dagster's own services colour their records, its runs and sensors do not, the
    API's do not; relayed, the console reads in one format."""
    return _ANSI.sub("", line)


def relay(source: IO[str], dest: IO[str], console: ConsoleFilter) -> threading.Thread:
    """A daemon thread copying ``source`` to ``dest`` through the filter, line by line, until EOF. It never stops
    reading early (a child writing into a full pipe would block)."""

    def run() -> None:
        for line in source:
            try:
                if console.keep(line):
                    dest.write(plain(line))
                    dest.flush()
            except Exception:  # a closed or broken terminal: keep draining the pipe
                continue

    thread = threading.Thread(target=run, name="dagster-console", daemon=True)
    thread.start()
    return thread
