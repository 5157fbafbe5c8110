"""``EngineConfig``: which engine to start and with what, discriminated by ``kind``.

Also the one way a CLI's ``--set key=value`` pairs become typed engine settings, so a plan and a
command line are validated by the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from servetune.engines.catalog import FlagError
from servetune.engines.common import EngineBase
from servetune.engines.external import ExternalConfig
from servetune.engines.sglang import SGLangConfig
from servetune.engines.sim import SimConfig
from servetune.engines.transformers import TransformersConfig
from servetune.engines.vllm import KNOBS as VLLM_KNOBS
from servetune.engines.vllm import VLLMConfig

EngineConfig = Annotated[SGLangConfig | VLLMConfig | SimConfig | TransformersConfig | ExternalConfig, Field(discriminator="kind")]
ENGINE_KINDS = ("sglang", "vllm", "sim", "transformers", "external")
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
    if kind in ("sglang", "sim"):
        if kind == "sglang":
            data = {"kind": kind, "model": model, "args": pairs, **fields}
        else:
            data = {"kind": kind, "args": pairs, **fields}
            if model:
                data["model_profile"] = model
    elif kind == "vllm":
        data = {"kind": kind, "model": model, **fields}
        for key, value in pairs.items():
            field = key.replace("-", "_")
            if field not in VLLM_KNOBS:
                known = ", ".join(f.replace("_", "-") for f in VLLM_KNOBS)
                raise FlagError(f"unknown flag --{key.replace('_', '-')} for vllm (servetune's vLLM knobs: {known})")
            data[field] = value
    elif kind == "transformers":
        data = {"kind": kind, "model": model, **fields}
        for key, value in pairs.items():
            data[key.replace("-", "_")] = value
    elif kind == "external":
        if pairs:
            raise FlagError("an external endpoint takes no --set flags (it is not launched by servetune)")
        data = {"kind": kind, **fields}
    else:
        raise FlagError(f"unknown engine {kind!r} (one of {', '.join(ENGINE_KINDS)})")
    try:
        return parse_engine_config(data)
    except ValidationError as exc:
        raise FlagError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"] if p not in ENGINE_KINDS)
        if where in VLLM_KNOBS:
            where = VLLM_KNOBS[where]
        cause = err.get("ctx", {}).get("error") if err["type"] == "value_error" else None
        text = str(cause or err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {text}" if where else text)
    return "; ".join(parts)
