"""Numbers read from a plan, a workload file or ``servetune bench``'s options: never a boolean, always finite,
never absurdly large (issue 31).

pydantic's lax mode, which lets YAML's ``"8192"`` through as 8192, also reads ``true`` as 1 and ``"inf"`` or
``.nan`` as floats, and nothing capped a size: ``concurrency: true`` ran one stream, ``--rate inf`` ran and
recorded null, and a concurrency of 10**9 spun a dry run forever. The plan's own models use the types below
(a boolean refused before pydantic coerces it; the limits as ``le=``) and ``allow_inf_nan=False``;
:func:`check_numbers` catches the same two mistakes in the models a plan borrows from other modules (SLA,
workload, engine, runner, validity rules) by comparing what was written with what was validated.
The limits are far above any real trial and far below what would hang the client (docs/reliability.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from servetune.names import MAX_NAME, check_label  # noqa: F401  (MAX_NAME re-exported: servetune.plan)

MAX_STREAMS = 100_000  #: concurrency, ramp levels, max_in_flight, protocols; bench --concurrency, --waves
MAX_RATE = 100_000  #: requests/s: baseline.rate, ramp levels in rate mode; bench --rate
MAX_REQUESTS = 10_000_000  #: requests (measured, warm-up) of a trial, max_requests_per_trial; --requests
MAX_LEVEL = max(MAX_STREAMS, MAX_RATE)  #: a ramp level: streams, or requests/s in rate mode
MAX_LIST = 64  #: ramp levels; values of one refine flag (a dry run replays the walk at every step: 5,000 spun)
MAX_GRID_VALUES = 128  #: values of every flag in the refine grid together

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """A plan section: unknown keys and inf/nan refused (its numbers use the types below)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _bool_error(what: str, value: bool) -> PydanticCustomError:
    return PydanticCustomError("bool_number", "Input should be {what}, not a boolean ({value})",
                               {"what": what, "value": str(value).lower()})


def non_finite(v: Any) -> bool:
    """inf, -inf or nan, as a float or as text pydantic would read as one (``"inf"``, ``"NaN"``)."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return False
    return isinstance(v, float) and not math.isfinite(v)


def _not_bool(what: str) -> BeforeValidator:
    def check(v: Any) -> Any:
        if isinstance(v, bool):
            raise _bool_error(what, v)
        if non_finite(v):  # pydantic's own check too (allow_inf_nan=False), said once, not per union member
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        return v
    return BeforeValidator(check)


Int = Annotated[int, _not_bool("an integer")]
Number = Annotated[float, _not_bool("a number")]
RampLevel = Annotated[int | float, _not_bool("a number"), Field(le=MAX_LEVEL)]  # streams, or requests/s
Streams = Annotated[int, _not_bool("an integer"), Field(ge=1, le=MAX_STREAMS)]
Rate = Annotated[float, _not_bool("a number"), Field(gt=0, le=MAX_RATE)]
Requests = Annotated[int, _not_bool("an integer"), Field(ge=1, le=MAX_REQUESTS)]
Warmup = Annotated[int, _not_bool("an integer"), Field(ge=0, le=MAX_REQUESTS)]


def check_protocol_sizes(protocols: list[Any]) -> None:
    """``protocols[i]``: streams and requests under the same limits as the plan's own trials."""
    for i, p in enumerate(protocols):
        for name, limit in ("concurrency", MAX_STREAMS), ("requests", MAX_REQUESTS), ("warmup", MAX_REQUESTS):
            if getattr(p, name) > limit:
                raise ValueError(f"protocols.{i}.{name}: Input should be less than or equal to {limit}")


def check_numbers(raw: Any, model: M) -> M:
    """``model``; a ValidationError (one entry per field) where ``raw`` (the data as written) held a boolean
    that ``model`` (the same data, validated) turned into a number, or a number that is not finite."""
    errors = list(_walk(raw, model, ()))
    if errors:
        raise ValidationError.from_exception_data(type(model).__name__, errors)
    return model


#: pydantic's bounds: said of nan (every comparison false) they would blame the bound, not the number
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def error_text(err: Mapping[str, Any]) -> str:
    """One pydantic error's message, ``Value error, `` dropped; a bound broken by inf or nan (in a model that
    allows them) says the number must be finite."""
    if err["type"] in _BOUNDS and non_finite(err.get("input")):
        return "Input should be a finite number"
    return str(err["msg"]).removeprefix("Value error, ")


def _walk(raw: Any, value: Any, loc: tuple[str | int, ...]) -> Iterator[InitErrorDetails]:
    if isinstance(value, BaseModel):  # only the fields that were written: a default is not the user's number
        if isinstance(raw, Mapping):
            for name, info in type(value).model_fields.items():
                key = info.alias or name
                if key in raw:
                    yield from _walk(raw[key], getattr(value, name), (*loc, key))
    elif isinstance(value, Mapping) and isinstance(raw, Mapping):
        for key in raw:
            if key in value:
                yield from _walk(raw[key], value[key], (*loc, key))
    elif isinstance(value, (list, tuple)) and isinstance(raw, (list, tuple)) and len(raw) == len(value):
        for i, (r, v) in enumerate(zip(raw, value, strict=True)):
            yield from _walk(r, v, (*loc, i))
    elif isinstance(raw, bool) and isinstance(value, (int, float)) and not isinstance(value, bool):
        what = "an integer" if isinstance(value, int) else "a number"
        yield {"type": _bool_error(what, raw), "loc": loc, "input": raw}
    elif isinstance(value, float) and not math.isfinite(value):
        yield {"type": "finite_number", "loc": loc, "input": raw}


#: ``servetune bench``'s numeric options: (parameter, upper limit or None); every float one must be finite
BENCH_LIMITS: dict[str, int | None] = {
    "concurrency": MAX_STREAMS, "waves": MAX_STREAMS, "rate": MAX_RATE, "requests": MAX_REQUESTS,
    "warmup": MAX_REQUESTS, "min_completions": MAX_REQUESTS, "trace_speed": None, "burstiness": None,
    "gpu_interval_ms": None, "timeout_s": None, "idle_timeout": None, "min_window_s": None,
    "read_batch_ms": None,
}


def check_bench_options(options: Mapping[str, Any]) -> None:
    """``servetune bench``'s parameters (its ``locals()``): ValueError naming the option for a number that
    is not finite (an ``--sla`` bound too) or above its limit, before anything is built or sent."""
    for item in options.get("sla") or []:
        key, _, value = str(item).partition("=")
        if non_finite(value.strip()):
            raise ValueError(f"--sla {key.strip()}: Input should be a finite number, got {value.strip()}")
    for name, limit in BENCH_LIMITS.items():
        value, flag = options.get(name), "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag}: Input should be a finite number, got {value}")
        if limit is not None and value is not None and value > limit:
            got = f"{value:g}" if isinstance(value, float) else value
            raise ValueError(f"{flag}: Input should be less than or equal to {limit}, got {got}")


#: a plan's name: a label that names the campaign's folder (servetune.names: printable, no separator, bounded)
Label = Annotated[str, AfterValidator(check_label)]
