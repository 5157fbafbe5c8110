"""Reading a plan: YAML (or JSON) from a file or a mapping to a TuningPlan, or one PlanError that names the file
and the path of every bad field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servetune.numbers import check_numbers, error_text
from servetune.plan.model import TuningPlan


class PlanError(ValueError):
    """A plan that cannot run; the message names the file and the path of every bad field."""


def _format_errors(source: str, exc: ValidationError) -> str:
    n = exc.error_count()
    lines = [f"{source}: invalid tuning plan ({n} error{'' if n == 1 else 's'})"]  # then one line per field
    for err in exc.errors():
        loc = ".".join(str(p) or "''" for p in err["loc"] if p != "[key]")  # a bad key: its path names it
        msg = error_text(err)
        lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")  # whole-plan checks name their own path
    return "\n".join(lines)


def parse_plan(data: Any, *, source: str = "plan") -> TuningPlan:
    if data is None:
        raise PlanError(f"{source}: the plan is empty (a plan must be a mapping with name, model and sla)")
    if not isinstance(data, dict):
        raise PlanError(f"{source}: a plan must be a mapping of sections, got a {type(data).__name__}")
    try:
        return check_numbers(data, TuningPlan.model_validate(data))  # and in the sections other modules define
    except ValidationError as exc:
        raise PlanError(_format_errors(source, exc)) from None


def load_plan(path: str | Path) -> TuningPlan:
    """Read a YAML (or JSON) plan; a missing file or a bad field raises PlanError naming it."""
    from servetune.input_files import read_bytes
    from servetune.strict_yaml import YAMLError, load_yaml

    path = Path(path)
    try:
        text = read_bytes(path).decode("utf-8")  # a FIFO or device named as the plan: refused, never read
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: cannot read plan: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}"
                        f" at offset {exc.start})") from None
    try:
        data = load_yaml(text)  # a key given twice is an error, not a silent override
    except YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML{_yaml_where(exc)}") from None
    return parse_plan(data, source=str(path))


def _yaml_where(exc: Exception) -> str:
    """`` at line 2, column 1: expected ',' or ']'``: where and what, on one line (PyYAML's own is several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {' '.join(str(what).split())}"
