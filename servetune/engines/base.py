"""``EngineConfig``: which engine to start and with what, discriminated by ``kind`` (``registry.ENGINES``).

Also the one way a CLI's ``--set key=value`` pairs become typed engine settings, so a plan and a
command line are validated by the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from servetune.engines.catalog import FlagError
from servetune.engines.common import EngineBase
from servetune.engines.registry import ENGINE_KINDS, ENGINES, EngineConfig

__all__ = ["ENGINE_KINDS", "EngineConfig", "engine_from_cli", "parse_engine_config", "split_sets"]
_adapter: TypeAdapter[Any] = TypeAdapter(EngineConfig)


def parse_engine_config(data: dict[str, Any]) -> EngineBase:
    """An engine config from plain data (a plan's YAML); pydantic's error names the bad field."""
    return _adapter.validate_python(data)


def split_sets(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{k: v}``; a pair without ``=`` or a key given twice is an error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise FlagError(f"--set expects key=value, got {pair!r}")
        if key in out:
            raise FlagError(f"--set {key} given twice")
        out[key] = value
    return out


def engine_from_cli(kind: str, *, model: str | None, sets: Iterable[str], **fields: Any) -> EngineBase:
    """The engine config a ``servetune serve`` command line describes (values typed per engine)."""
    pairs = split_sets(sets)
    fields = {k: v for k, v in fields.items() if v is not None}
    cls = ENGINES.get(kind)
    if cls is None:
        raise FlagError(f"unknown engine {kind!r} (one of {', '.join(ENGINE_KINDS)})")
    data = cls.cli_data(model, pairs, fields)
    try:
        return parse_engine_config(data)
    except ValidationError as exc:
        raise FlagError(_one_line(exc, cls)) from None


def _one_line(exc: ValidationError, cls: type[EngineBase]) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"] if p not in ENGINE_KINDS)
        where = cls.field_flags.get(where, where)  # a typed field is named by its flag
        cause = err.get("ctx", {}).get("error") if err["type"] == "value_error" else None
        text = str(cause or err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {text}" if where else text)
    return "; ".join(parts)
