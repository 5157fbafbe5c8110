"""The tuning walk's view of an engine (engine knowledge, so it lives with the engines): one flat ``{flag: value}`` dict, whatever the engine kind.

SGLang and the simulator keep their launch flags in ``args``; vLLM has typed fields for the knobs
it tunes (``max_num_seqs`` -> ``max-num-seqs``). The decisions only ever see hyphenated flag
names; ``with_flags`` turns a trial's flags back into a validated EngineConfig (a flag the engine
version does not know is refused there, before any server starts).
"""

from __future__ import annotations

from typing import Any

from servetune.engines import EngineBase, parse_engine_config
from servetune.engines.vllm import KNOBS as VLLM_KNOBS

FlagValue = int | float | str | bool  # one server flag's value as a plan writes it
Flags = dict[str, FlagValue | None]  # a trial's server flags, hyphenated names (None: a bare store-true flag)

# vLLM knobs that say how the server is launched but are not tuned (identity, dtype, context)
_VLLM_FIXED = ("served_model_name", "dtype", "max_model_len", "enable_prompt_tokens_details", "enforce_eager",
               "tensor_parallel_size")
_VLLM_FLAG_TO_FIELD = {flag.removeprefix("--"): f for f, flag in VLLM_KNOBS.items() if f not in _VLLM_FIXED}


class KnobError(ValueError):
    """A flag the engine kind cannot take through tuning."""


def engine_flags(engine: EngineBase) -> Flags:
    """The server-side flags a trial varies, from the engine config."""
    kind = getattr(engine, "kind", None)
    if kind in ("sglang", "sim"):
        return dict(engine.args)  # type: ignore[attr-defined]
    if kind == "vllm":
        return {flag: getattr(engine, f) for flag, f in _VLLM_FLAG_TO_FIELD.items() if getattr(engine, f) is not None}
    return {}


def with_flags(engine: EngineBase, flags: Flags) -> EngineBase:
    """A copy of ``engine`` launched with exactly ``flags``; validated as a plan's engine would be."""
    kind = getattr(engine, "kind", None)
    data: dict[str, Any] = engine.model_dump()
    if kind in ("sglang", "sim"):
        data["args"] = dict(flags)
    elif kind == "vllm":
        unknown = [k for k in flags if k not in _VLLM_FLAG_TO_FIELD]
        if unknown:
            raise KnobError(f"vLLM knobs servetune tunes are {sorted(_VLLM_FLAG_TO_FIELD)}; not {unknown}")
        for flag, field in _VLLM_FLAG_TO_FIELD.items():
            data[field] = flags.get(flag)
    elif flags:
        raise KnobError(f"an {kind} engine takes no server flags, got {sorted(flags)}")
    return parse_engine_config(data)


def sim_flags(engine: EngineBase, flags: Flags, *, gpu: str | None = None, model: str | None = None) -> dict[str, Any]:
    """Flags for ``servetune.sim`` (virtual time): the trial's SGLang flags, the profiles, metrics on.

    Estimating a real SGLang plan (``gpu``/``model`` given) keeps only the flags the simulator models."""
    if gpu or model:
        from servetune.sim.args import modelled

        flags = modelled(flags)
    out: dict[str, Any] = {"enable-metrics": True, "enable-cache-report": True, **flags}
    out["gpu-profile"] = gpu or getattr(engine, "gpu_profile", None) or "A100-80G"
    out["model-profile"] = model or getattr(engine, "model_profile", None) or "llama-3.1-8b"
    return out
