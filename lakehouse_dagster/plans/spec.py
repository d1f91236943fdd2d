"""The plan file: one reader or writer, a target mode, and stages that widen (shadow → datasets → workspace →
global), each with its soak, approval, time window and analysis thresholds; a writer plan may end with a
``complete`` stage (always approved first) that retires the Postgres rows of the datasets the plan moved.

Validation collects every problem and reports one line per problem, each naming the key (``stages[1].soak``)
and what to do, so a plan is fixed in one edit. Nothing here reads the database: what the plan would do to the
flags (and which gate would refuse it) is ``plans/render.py``'s. The JSON Schema of the same shape is
``plans/schema.py``.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import yaml

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.flags.registry import READ, READERS, WRITE, WRITERS, rank
from lakehouse_dagster.plans.window import Window, parse_window

SHADOW, DATASETS, WORKSPACE, GLOBAL, COMPLETE = "shadow", "datasets", "workspace", "global", "complete"
SCOPE_KEYS = (SHADOW, DATASETS, WORKSPACE, GLOBAL, COMPLETE)  # a stage names exactly one: its kind
_WIDTH = {SHADOW: 0, DATASETS: 1, WORKSPACE: 2, GLOBAL: 3, COMPLETE: 4}
# what a complete stage takes (from the plan's defaults too); the rest (soak, analysis, ...) is about a flip
_COMPLETE_KEYS = ("approval", "window", "max_datasets", "export_to")

_DURATION = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?\s*$")
DURATION_HELP = "write a duration like 30s, 10m, 1h or 1h30m"


@dataclasses.dataclass(frozen=True)
class Analysis:
    """When a stage's analysis passes, fails or is inconclusive (plans/analysis.py)."""

    sample: int = 20  # datasets of the stage canaried afresh at the end of its soak (random; all when fewer)
    max_fallbacks: int = 0  # read fallbacks on the plan's datasets since the stage flipped: more fails the stage
    max_failed_syncs: int = 0  # failed syncs of the plan's datasets since the stage flipped: more fails it
    max_inconclusive: int = 0  # canaried datasets that may be lagging / no-snapshot / error and the stage pass
    pause_after: int = 600  # inconclusive this long (seconds): the plan pauses and says why
    retry_every: int = 30  # seconds between analysis runs while inconclusive
    min_reads: int = 20  # shadow stage: comparisons needed at caught-up versions
    min_consistency: float = 100.0  # shadow stage: the consistency rate (percent) needed to pass
    # writer plans: a canaried dataset whose reverse mirror was further behind than this when the analysis began
    # does not count as ok (the reverse's driver is slow or down: a rollback then would need a backfill)
    max_reverse_lag_seconds: int = 60


@dataclasses.dataclass(frozen=True)
class Stage:
    kind: str  # shadow | datasets | workspace | global
    count: int | None = None  # datasets: N
    workspaces: tuple[uuid.UUID, ...] = ()  # workspace: one flip per workspace, in order
    within: uuid.UUID | None = None  # datasets: pick the candidates in this workspace
    soak: int = 0  # seconds; the effective soak is max(this, the project's soak)
    approval: bool = False  # an operator approves before the stage starts
    window: Window | None = None
    max_datasets: int | None = None  # refuse (pause) a stage that would move more datasets; None: no cap
    ok_within: int = 86_400  # datasets: a reader candidate's ok verdict must be this recent (seconds)
    analysis: Analysis = Analysis()
    export_to: str | None = None  # complete: write each dataset's rows as Parquet under <dir>/<dataset id> first

    def describe(self) -> str:
        if self.kind == COMPLETE:
            return "complete"
        if self.kind == DATASETS:
            return f"datasets: {self.count}" + (f" in workspace {self.within}" if self.within else "")
        if self.kind == WORKSPACE:
            return "workspace: " + ", ".join(map(str, self.workspaces))
        return self.kind


@dataclasses.dataclass(frozen=True)
class Plan:
    kind: str  # read | write
    name: str  # the reader or writer
    mode: str  # the target mode
    stages: tuple[Stage, ...]
    note: str | None = None
    # a writer plan turns the reverse mirror on (dataset scope, audited) for each dataset a stage moves before its
    # flip, so that an abort or a rollback finds Postgres holding every native row (docs/rollouts.md)
    arm_reverse: bool = True

    @property
    def flag_word(self) -> str:
        return "reader" if self.kind == READ else "writer"

    def as_dict(self) -> dict:
        """The normalised plan (defaults filled, durations in seconds): what is stored and shown."""

        def stage(s: Stage) -> dict:
            d = dataclasses.asdict(s)
            d["workspaces"] = [str(w) for w in s.workspaces]
            d["within"] = str(s.within) if s.within else None
            d["window"] = s.window.text if s.window else None
            return d

        return {
            self.flag_word: self.name,
            "mode": self.mode,
            "note": self.note,
            **({"arm_reverse": self.arm_reverse} if self.kind == WRITE else {}),
            "stages": [stage(s) for s in self.stages],
        }


class _Errors:
    def __init__(self, origin: str):
        self.origin = origin
        self.lines: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.lines.append(f"{self.origin}: {key}: {message}" if key else f"{self.origin}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise BadInput("\n".join(self.lines))


def parse_duration(raw: Any, key: str = "duration") -> int:
    """Seconds from ``30s`` / ``10m`` / ``1h`` / ``1h30m`` / ``2d`` (or 0); BadInput names the key otherwise."""
    if isinstance(raw, bool) or raw is None:
        raise BadInput(f"{key}: {raw!r} is not a duration; {DURATION_HELP}")
    if isinstance(raw, int) and raw == 0:
        return 0
    m = _DURATION.match(str(raw)) if isinstance(raw, str) else None
    if not m or not any(m.groups()):
        raise BadInput(f"{key}: {raw!r} is not a duration; {DURATION_HELP}")
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


_TOP_KEYS = ("reader", "writer", "mode", "stages", "note", "defaults", "arm_reverse")
_STAGE_KEYS = (
    *SCOPE_KEYS,
    "within",
    "soak",
    "approval",
    "window",
    "max_datasets",
    "ok_within",
    "analysis",
    "export_to",
)
_ANALYSIS_KEYS = tuple(f.name for f in dataclasses.fields(Analysis))
_ANALYSIS_DURATIONS = ("pause_after", "retry_every")


def load_plan(text: str, origin: str = "plan") -> Plan:
    """Parse a plan file's text (YAML; JSON is YAML too) and validate it."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise BadInput(f"{origin}: not valid YAML{where} ({problem}); fix the file and run it again") from None
    return validate(raw, origin)


def validate(raw: Any, origin: str = "plan") -> Plan:  # noqa: C901
    """The plan from its parsed form; every problem at once, one line each. Long on purpose: one pass over the
    plan's keys in the order a reader of the file meets them, each check beside the key it names."""
    errors = _Errors(origin)
    if not isinstance(raw, dict):
        raise BadInput(f"{origin}: a plan is a mapping with reader (or writer), mode and stages; see docs/rollouts.md")
    for key in raw:
        if key not in _TOP_KEYS:
            errors.add(str(key), f"unknown key; a plan has {', '.join(_TOP_KEYS)}")
    kind, name = None, None
    if ("reader" in raw) == ("writer" in raw):
        errors.add("reader", "give exactly one of reader: <name> or writer: <name>")
    else:
        kind = READ if "reader" in raw else WRITE
        key = "reader" if kind == READ else "writer"
        name = str(raw[key])
        flag = (READERS if kind == READ else WRITERS).get(name)
        if flag is None:
            other = WRITERS if kind == READ else READERS
            hint = f" ({name} is a {'writer' if kind == READ else 'reader'})" if name in other else ""
            known = [f.name for f in (READERS if kind == READ else WRITERS).values() if f.ceiling != f.default]
            errors.add(key, f"unknown or not flippable {key} {name!r}{hint}; plans move one of {', '.join(known)}")
            kind = None
        elif flag.ceiling == flag.default:
            errors.add(key, f"{name} is locked at {flag.ceiling} (maxMode: {flag.ceiling_reason}); no plan can move it")
            kind = None
    mode = raw.get("mode")
    if kind is not None and name is not None:  # (name is set whenever kind is)
        flag = (READERS if kind == READ else WRITERS)[name]
        entry = "iceberg" if kind == READ else "iceberg_native"
        mode = str(mode if mode is not None else entry)
        if mode not in flag.allowed_modes or rank(kind, mode) < rank(kind, entry):
            allowed = [m for m in flag.allowed_modes if rank(kind, m) >= rank(kind, entry)]
            errors.add("mode", f"{mode!r} is not a target mode of {name}; use {' or '.join(allowed)}")
    note = raw.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > 500):
        errors.add("note", "a note is text under 500 characters")
    arm_reverse = raw.get("arm_reverse", True)
    if not isinstance(arm_reverse, bool):
        errors.add("arm_reverse", f"{arm_reverse!r} is not true or false")
    elif "arm_reverse" in raw and kind == READ:
        errors.add("arm_reverse", "a reader plan moves no writer: only a writer plan arms the reverse mirror")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        errors.add("defaults", "defaults is a mapping of stage keys (soak, approval, window, analysis, ...)")
        defaults = {}
    for key in defaults:
        if key in SCOPE_KEYS or key not in _STAGE_KEYS:
            errors.add(f"defaults.{key}", "not a stage setting; defaults take soak, approval, window, analysis, ...")
    stages_raw = raw.get("stages")
    stages: list[Stage] = []
    if not isinstance(stages_raw, list) or not stages_raw:
        errors.add("stages", "give a list of stages, e.g. - datasets: 2, - workspace: <uuid>, - global: true")
        stages_raw = []
    for i, s in enumerate(stages_raw):
        where = f"stages[{i}]"
        if not isinstance(s, dict):
            errors.add(where, "a stage is a mapping, e.g. {datasets: 2, soak: 10m}")
            continue
        # a complete stage takes from the defaults only what applies to it, and never approval: false
        takes = (lambda k: k in _COMPLETE_KEYS[1:]) if COMPLETE in s else (lambda k: k != "export_to")
        taken = [k for k in defaults if k not in SCOPE_KEYS and takes(k)]
        merged = {**{k: defaults[k] for k in taken}, **s}
        stage = _stage(merged, where, errors, kind)
        if stage is not None:
            stages.append(stage)
    _order(stages, errors)
    errors.raise_if_any()
    assert kind is not None and name is not None
    return Plan(kind, name, str(mode), tuple(stages), note, arm_reverse is not False)


def _stage(s: dict, where: str, errors: _Errors, kind: str | None) -> Stage | None:  # noqa: C901
    """Long on purpose: each stage key's parse and its one-line error beside it."""
    for key in s:
        if key not in _STAGE_KEYS:
            errors.add(f"{where}.{key}", f"unknown key; a stage has one of {', '.join(SCOPE_KEYS)} and {_settings()}")
    scopes = [k for k in SCOPE_KEYS if k in s]
    if len(scopes) != 1:
        errors.add(where, f"give exactly one of {', '.join(SCOPE_KEYS)} (found {', '.join(scopes) or 'none'})")
        return None
    what = scopes[0]
    fields: dict[str, Any] = {"kind": what}
    value = s[what]
    if what == SHADOW:
        if value is not True:
            errors.add(f"{where}.shadow", "write shadow: true")
        if kind == WRITE:
            errors.add(f"{where}.shadow", "a shadow stage compares reads; writer plans have none")
    elif what == GLOBAL:
        if value is not True:
            errors.add(f"{where}.global", "write global: true")
    elif what == COMPLETE:
        _complete_stage(s, where, errors, kind, fields)
    elif what == DATASETS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.add(f"{where}.datasets", f"{value!r} is not a count; write datasets: N with N of 1 or more")
        else:
            fields["count"] = value
        if "within" in s:
            fields["within"] = _uuid(s["within"], f"{where}.within", errors)
    elif what == WORKSPACE:
        values = value if isinstance(value, list) else [value]
        ids = [_uuid(v, f"{where}.workspace", errors) for v in values]
        if not values:
            errors.add(f"{where}.workspace", "give a workspace uuid (or a list of them)")
        fields["workspaces"] = tuple(i for i in ids if i is not None)
    if "export_to" in s and what != COMPLETE:
        errors.add(f"{where}.export_to", "only a complete stage exports the rows it retires")
    if "within" in s and what != DATASETS:
        errors.add(f"{where}.within", "only a datasets stage picks its candidates within a workspace")
    for key in ("soak", "ok_within"):
        if key in s:
            try:
                fields[key] = parse_duration(s[key], f"{where}.{key}")
            except BadInput as exc:
                errors.lines.append(f"{errors.origin}: {exc}")
    if "approval" in s:
        if not isinstance(s["approval"], bool):
            errors.add(f"{where}.approval", "write approval: true or approval: false")
        else:
            fields["approval"] = s["approval"]
    if "window" in s:
        try:
            fields["window"] = parse_window(s["window"])
        except BadInput as exc:
            errors.add(f"{where}.window", str(exc))
    if "max_datasets" in s:
        v = s["max_datasets"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            errors.add(f"{where}.max_datasets", f"{v!r} is not a count; write a whole number of 1 or more")
        else:
            fields["max_datasets"] = v
    if "analysis" in s:
        analysis = _analysis(s["analysis"], f"{where}.analysis", errors)
        if analysis is not None:
            fields["analysis"] = analysis
    if what == DATASETS and fields.get("count") and fields.get("max_datasets", fields["count"]) < fields["count"]:
        errors.add(f"{where}.max_datasets", f"is below datasets: {fields['count']}; raise it or move fewer")
    try:
        return Stage(**fields)
    except TypeError:  # a field left out by an error above: reported already
        return None


def _complete_stage(s: dict, where: str, errors: _Errors, kind: str | None, fields: dict) -> None:
    """A complete stage: writer plans only, approved first (it deletes Postgres rows), and none of a flip's keys."""
    if s[COMPLETE] is not True:
        errors.add(f"{where}.complete", "write complete: true")
    if kind == READ:
        errors.add(
            f"{where}.complete", "complete retires the Postgres rows of native datasets; only writer plans have it"
        )
    if s.get("approval") is False:
        errors.add(
            f"{where}.approval", "a complete stage deletes Postgres rows: it always waits for an approval; drop the key"
        )
    fields["approval"] = True
    for key in s:
        if key in _STAGE_KEYS and key not in SCOPE_KEYS and key not in _COMPLETE_KEYS and key != "within":
            errors.add(
                f"{where}.{key}",
                f"a complete stage has no {key} (its conditions are complete's own: native past the soak, reverse "
                f"parity ok, no Postgres-locked consumer); it takes {', '.join(_COMPLETE_KEYS)}",
            )
    if "export_to" in s:
        v = s["export_to"]
        if not isinstance(v, str) or not v.strip():
            errors.add(f"{where}.export_to", f"{v!r} is not a directory; write export_to: /path/to/dir")
        else:
            fields["export_to"] = v.strip()


def _analysis(raw: Any, where: str, errors: _Errors) -> Analysis | None:
    if not isinstance(raw, dict):
        errors.add(where, f"a mapping of {', '.join(_ANALYSIS_KEYS)}")
        return None
    fields: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in _ANALYSIS_KEYS:
            errors.add(f"{where}.{key}", f"unknown key; analysis has {', '.join(_ANALYSIS_KEYS)}")
        elif key in _ANALYSIS_DURATIONS:
            try:
                fields[key] = parse_duration(v, f"{where}.{key}")
            except BadInput as exc:
                errors.lines.append(f"{errors.origin}: {exc}")
        elif key == "min_consistency":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
                errors.add(f"{where}.{key}", f"{v!r} is not a percentage; write a number from 0 to 100")
            else:
                fields[key] = float(v)
        elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
            errors.add(f"{where}.{key}", f"{v!r} is not a count; write a whole number of 0 or more")
        else:
            fields[key] = v
    if fields.get("min_reads") == 0:
        errors.add(f"{where}.min_reads", "a shadow stage needs at least 1 comparison to measure a rate")
    return Analysis(**fields)


def _uuid(raw: Any, key: str, errors: _Errors) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(raw).strip())
    except ValueError:
        errors.add(key, f"{raw!r} is not a uuid; copy the id from lakehouse datasets")
        return None


def _settings() -> str:
    return ", ".join(k for k in _STAGE_KEYS if k not in SCOPE_KEYS)


def _order(stages: list[Stage], errors: _Errors) -> None:
    """Stages widen: an optional shadow stage first, then datasets, workspace, global (global last, but for a
    complete stage after them all)."""
    width = -1
    for i, s in enumerate(stages):
        w = _WIDTH[s.kind]
        if s.kind == COMPLETE and i != len(stages) - 1:
            errors.add(f"stages[{i}]", "a complete stage comes last (nothing moves once the Postgres rows are gone)")
        elif s.kind == COMPLETE and i == 0:
            errors.add(f"stages[{i}]", "a complete stage needs a stage before it that moves datasets to iceberg_native")
        elif s.kind == SHADOW and i != 0:
            errors.add(f"stages[{i}]", "a shadow stage comes first (it measures before anything moves to Iceberg)")
        elif w < width:
            errors.add(
                f"stages[{i}]",
                f"{s.kind} after a wider stage; stages widen: {SHADOW}, {DATASETS}, {WORKSPACE}, then {GLOBAL}",
            )
        elif s.kind == GLOBAL and w == width:
            errors.add(f"stages[{i}]", "a second global stage; global is the last stage")
        width = max(width, w)
    seen: set[uuid.UUID] = set()
    for i, s in enumerate(stages):
        for ws in s.workspaces:
            if ws in seen:
                errors.add(f"stages[{i}].workspace", f"workspace {ws} appears in an earlier stage; list each once")
            seen.add(ws)
