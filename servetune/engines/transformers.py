"""Hugging Face ``transformers serve`` with continuous batching: a real OpenAI-compatible engine that
runs where SGLang and vLLM cannot be installed (the H200 machines here have transformers but no
package registry). It reports usage but no cached tokens, so its prefix hit rate is unknown.

The knobs tuning turns are ``transformers serve``'s own continuous-batching options (its typer
``Serve`` command: ``--cb-block-size``, ``--cb-num-blocks``, ``--cb-max-batch-tokens``,
``--cb-max-memory-percent``, ``--cb-use-cuda-graph/--no-cb-use-cuda-graph``); they act only with
``--continuous-batching``. An unset knob (None) is left to transformers' own default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from servetune.engines.common import EngineBase, Flags, FlagValue, KnobError

#: config field -> ``transformers serve`` flag
FLAGS: dict[str, str] = {
    "device": "--device",
    "dtype": "--dtype",
    "continuous_batching": "--continuous-batching",
    "cb_block_size": "--cb-block-size",
    "cb_num_blocks": "--cb-num-blocks",
    "cb_max_batch_tokens": "--cb-max-batch-tokens",
    "cb_max_memory_percent": "--cb-max-memory-percent",
    "cb_use_cuda_graph": "--cb-use-cuda-graph",
}
#: the continuous-batching knobs the tuning walk turns: flag (no dashes) -> field, in argv order
CB_KNOBS = ("cb_block_size", "cb_num_blocks", "cb_max_batch_tokens", "cb_max_memory_percent", "cb_use_cuda_graph")
TUNED: dict[str, str] = {FLAGS[f].removeprefix("--"): f for f in CB_KNOBS}


class TransformersConfig(EngineBase):
    kind: Literal["transformers"] = "transformers"
    model: str = Field(description="local model directory (requests must name exactly this path)")
    python: str = Field(default="python3", description="interpreter where transformers[serving] is installed")
    device: str = "cuda"
    dtype: str = "bfloat16"
    continuous_batching: bool = True
    cb_block_size: int | None = Field(default=None, ge=1, description="KV-cache block size in tokens")
    cb_num_blocks: int | None = Field(default=None, ge=1, description="KV-cache blocks (None: from the memory share)")
    cb_max_batch_tokens: int | None = Field(default=None, ge=1, description="tokens per batch at most")
    cb_max_memory_percent: float | None = Field(default=None, gt=0, le=1,
                                                description="cap on the KV cache's share of free GPU memory")
    cb_use_cuda_graph: bool | None = Field(default=True, description="without it the engine is CPU-bound (3-4x "
                                           "slower); None: transformers decides")
    extra_args: list[str] = Field(default_factory=list, description="further flags, passed verbatim")

    health_paths: tuple[str, ...] = ("/health",)
    info_paths: tuple[str, ...] = ("/v1/models",)

    display_name = "transformers"
    field_flags = FLAGS
    knob_fields = TUNED
    model_from_plan = True

    @property
    def served_model(self) -> str | None:
        return self.model

    def flags(self) -> Flags:
        return super().flags() if self.continuous_batching else {}  # the cb knobs act only with it

    def flag_fields(self, flags: Mapping[str, FlagValue | None]) -> dict[str, Any]:
        if not self.continuous_batching and any(v is not None for v in flags.values()):
            raise KnobError(f"transformers' cb-* knobs act only with continuous_batching: true, got {sorted(flags)}")
        return super().flag_fields(flags)

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        argv = [self.python, "-m", "transformers.cli.transformers", "serve", self.model, "--host", host,
                "--port", str(port), "--device", self.device, "--dtype", self.dtype]
        if self.continuous_batching:
            argv.append("--continuous-batching")
            if self.cb_use_cuda_graph is not None:
                argv.append("--cb-use-cuda-graph" if self.cb_use_cuda_graph else "--no-cb-use-cuda-graph")
            for field in CB_KNOBS[:-1]:
                value = getattr(self, field)
                if value is not None:
                    argv += [FLAGS[field], str(value)]
        return argv + list(self.extra_args)

    def describe(self) -> str:
        return f"transformers serve {self.model}"
