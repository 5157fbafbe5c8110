"""How a trial result file is checked on the way in: one path for ``validate``, ``load`` and the reports.

Why its own module: a result that only looks right (``status: great``, ``e2e_ms: "fast"``, no ``summary``)
must fail the same way wherever it is read, with one line naming the file and the path of the bad field
(``records[3].e2e_ms: expected a number, got 'fast'``), before any checklist or database sees it.
``servetune.result`` builds its pydantic model from the pieces here; pydantic does the checking.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, Required

import orjson
from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from servetune.records import RequestRecord
from servetune.redact import redact_text

#: the sections a result cannot do without (besides ``schema``, ``trial_id`` and ``created_at``)
REQUIRED_SECTIONS = ("summary", "records")
STRICT = ConfigDict(strict=True, extra="ignore")  # numbers are numbers, not strings; unknown keys are dropped


class ResultError(ValueError):
    """A file that is not a well-formed trial result; the message names the file and the bad field."""


def _record_typed_dict() -> type:
    """``RequestRecord``'s fields as a strict TypedDict (the dataclass stays plain for the hot path)."""
    hints = typing.get_type_hints(RequestRecord)
    fields = {k: (Required[v] if k == "request_id" else v) for k, v in hints.items()}
    td = TypedDict("RequestRecordIn", fields, total=False)  # type: ignore[operator]
    td.__pydantic_config__ = STRICT  # type: ignore[attr-defined]
    return td


RecordIn = _record_typed_dict()


class GpuSampleIn(TypedDict, total=False):
    """One ``gpu.samples`` entry as the loader stores it."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    t_s: Required[float]
    gpu: int
    mem_used: int | None
    mem_total: int | None
    util: float | None
    power_w: float | None


class ServerSampleIn(TypedDict, total=False):
    """One ``server.samples`` entry (a scraped metric)."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    t_s: Required[float]
    name: Required[str]
    labels: dict[str, Any] | None
    value: float | None


_GPU_SAMPLES: TypeAdapter[list[Any]] = TypeAdapter(list[GpuSampleIn])
_SERVER_SAMPLES: TypeAdapter[list[Any]] = TypeAdapter(list[ServerSampleIn])

_WHAT = {
    "float_type": "expected a number", "float_parsing": "expected a number",
    "int_type": "expected an integer", "int_parsing": "expected an integer", "int_from_float": "expected an integer",
    "bool_type": "expected true or false", "bool_parsing": "expected true or false",
    "string_type": "expected a string", "list_type": "expected a list",
    "dict_type": "expected an object", "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "string_too_short": "must not be empty", "extra_forbidden": "unknown field",
}


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's ``('records', 3, 'e2e_ms')`` as ``records[3].e2e_ms``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "nullable", "typed-dict")):  # pydantic's inner tags
            out += f".{part}" if out else str(part)
    return out


def describe(error: Any, *, prefix: tuple[Any, ...] = ()) -> str:
    """One pydantic error as ``path: what was expected, got VALUE``."""
    loc = (*prefix, *error["loc"])
    where = field_path(loc)
    kind = error["type"]
    if kind == "missing":
        section = len(loc) == 1 and loc[0] in REQUIRED_SECTIONS
        return f"{where}: required {'section' if section else 'field'} missing"
    if kind == "literal_error":
        what = f"expected one of {error['ctx']['expected']}"
    else:
        what = _WHAT.get(kind) or error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return f"{where}: {what}"
    got = redact_text(repr(error.get("input")))  # the message reaches logs: a misplaced secret stays masked
    return f"{where}: {what}, got {got if len(got) <= 60 else got[:57] + '...'}"


def first_error(exc: ValidationError, *, prefix: tuple[Any, ...] = ()) -> str:
    """The first error, and how many more there are: one line however bad the file."""
    errors = exc.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return describe(errors[0], prefix=prefix) + more


def check_samples(gpu: dict[str, Any], server: dict[str, Any]) -> None:
    """GPU and server samples have the shape the warehouse stores (kept as plain dicts in the result)."""
    for section, adapter, data in (("gpu", _GPU_SAMPLES, gpu), ("server", _SERVER_SAMPLES, server)):
        samples = data.get("samples")
        if samples is None:
            continue
        try:
            adapter.validate_python(samples)
        except ValidationError as exc:
            raise ResultError(first_error(exc, prefix=(section, "samples"))) from None


def read_json(path: str | Path) -> Any:
    """A JSON file, or one line saying why it cannot be read."""
    from servetune.input_files import read_bytes

    path = Path(path)
    try:
        raw = read_bytes(path)
        data = orjson.loads(raw)
        json.loads(raw, object_pairs_hook=_once_each)  # orjson keeps the last of a key given twice
    except IsADirectoryError:
        raise ResultError(f"{path}: is a directory, not a trial result file") from None
    except OSError as e:
        raise ResultError(f"{path}: cannot read ({e.strerror})") from None
    except orjson.JSONDecodeError as e:
        raise ResultError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except _DuplicateKey as e:
        raise ResultError(f"{path}: key {e.args[0]!r} is given twice in one object (the last would silently"
                          " win; servetune writes each key once: a hand edit or two files joined?)") from None
    return data


class _DuplicateKey(Exception):
    pass


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return obj
