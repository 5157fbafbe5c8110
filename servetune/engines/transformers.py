"""Hugging Face ``transformers serve`` with continuous batching: a real OpenAI-compatible engine that
runs where SGLang and vLLM cannot be installed (the H200 machines here have transformers but no
package registry). It reports usage but no cached tokens, so its prefix hit rate is unknown."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from servetune.engines.common import EngineBase


class TransformersConfig(EngineBase):
    kind: Literal["transformers"] = "transformers"
    model: str = Field(description="local model directory (requests must name exactly this path)")
    python: str = Field(default="python3", description="interpreter where transformers[serving] is installed")
    device: str = "cuda"
    dtype: str = "bfloat16"
    continuous_batching: bool = True
    cb_use_cuda_graph: bool = Field(default=True, description="without it the engine is CPU-bound (3-4x slower)")
    cb_max_memory_percent: float | None = Field(default=None, gt=0, le=1,
                                                description="cap on the KV cache's share of free GPU memory")
    extra_args: list[str] = Field(default_factory=list, description="further flags, passed verbatim")

    health_paths: tuple[str, ...] = ("/health",)
    info_paths: tuple[str, ...] = ("/v1/models",)

    @property
    def served_model(self) -> str | None:
        return self.model

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        argv = [self.python, "-m", "transformers.cli.transformers", "serve", self.model, "--host", host,
                "--port", str(port), "--device", self.device, "--dtype", self.dtype]
        if self.continuous_batching:
            argv.append("--continuous-batching")
            if self.cb_use_cuda_graph:
                argv.append("--cb-use-cuda-graph")
            if self.cb_max_memory_percent is not None:
                argv += ["--cb-max-memory-percent", str(self.cb_max_memory_percent)]
        return argv + list(self.extra_args)

    def describe(self) -> str:
        return f"transformers serve {self.model}"
