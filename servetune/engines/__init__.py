"""Serving engines: how to start one (argv), where it says it is ready, what it reports about itself.

One module per engine defines its config class; ``registry.ENGINES`` maps kind -> class."""

from servetune.engines.base import ENGINE_KINDS, EngineConfig, engine_from_cli, parse_engine_config
from servetune.engines.catalog import FlagError
from servetune.engines.common import EngineBase
from servetune.engines.external import ExternalConfig
from servetune.engines.failures import EngineFailure, FailureKind, classify
from servetune.engines.registry import ENGINES, engine_class
from servetune.engines.sglang import SGLangConfig
from servetune.engines.sim import SimConfig
from servetune.engines.transformers import TransformersConfig
from servetune.engines.vllm import VLLMConfig

__all__ = [
    "ENGINES", "ENGINE_KINDS", "EngineBase", "EngineConfig", "EngineFailure", "ExternalConfig", "FailureKind",
    "FlagError", "SGLangConfig", "SimConfig", "TransformersConfig", "VLLMConfig", "classify", "engine_class",
    "engine_from_cli", "parse_engine_config",
]
