"""The tuning walk's view of an engine (engine knowledge, so it lives with the engines): one flat
``{flag: value}`` dict, whatever the engine kind.

Each engine's config class says what its flags are (``EngineBase.flags``: SGLang and the simulator
keep their launch flags in ``args``; vLLM and transformers have typed fields for the knobs they tune,
``max_num_seqs`` -> ``max-num-seqs``) and which fields launch with a given set (``flag_fields``).
The decisions only ever see hyphenated flag names; ``with_flags`` turns a trial's flags back into a
validated EngineConfig (a flag the engine version does not know is refused there, before any server starts).
"""

from __future__ import annotations

from typing import Any

from servetune.engines import EngineBase, parse_engine_config
from servetune.engines.common import Flags, FlagValue, KnobError

__all__ = ["FlagValue", "Flags", "KnobError", "engine_flags", "sim_flags", "with_flags"]


def engine_flags(engine: EngineBase) -> Flags:
    """The server-side flags a trial varies, from the engine config."""
    return engine.flags()


def with_flags(engine: EngineBase, flags: Flags) -> EngineBase:
    """A copy of ``engine`` launched with exactly ``flags``; validated as a plan's engine would be."""
    data: dict[str, Any] = {**engine.model_dump(), **engine.flag_fields(flags)}
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
