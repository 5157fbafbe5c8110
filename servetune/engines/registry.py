"""The engines servetune knows: kind -> config class. Adding an engine = its module + one entry here.

Everything engine-specific is a method or class attribute of the config class (``common.EngineBase``):
launch argv, flags and their typing, the knobs tuning turns (``flags``/``flag_fields``), readiness and
info endpoints, the metric family prefix, log patterns, secrets handling, the ``servetune serve``
options. The plan's ``engine:`` section is parsed as the discriminated union of these classes.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from servetune.engines.common import EngineBase
from servetune.engines.external import ExternalConfig
from servetune.engines.sglang import SGLangConfig
from servetune.engines.sim import SimConfig
from servetune.engines.transformers import TransformersConfig
from servetune.engines.vllm import VLLMConfig

ENGINES: dict[str, type[EngineBase]] = {
    "sglang": SGLangConfig,
    "vllm": VLLMConfig,
    "sim": SimConfig,
    "transformers": TransformersConfig,
    "external": ExternalConfig,
}
ENGINE_KINDS = tuple(ENGINES)
EngineConfig = Annotated[Union[tuple(ENGINES.values())], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007


def engine_class(kind: Any) -> type[EngineBase] | None:
    """The config class of ``kind`` (None: not an engine servetune knows)."""
    return ENGINES.get(kind) if isinstance(kind, str) else None
