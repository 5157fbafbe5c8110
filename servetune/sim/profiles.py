"""GPU and model profiles: the data the simulator's cost model and KV-pool sizing run on.

Profiles are YAML files (``servetune/sim/profiles/{gpu,model}/NAME.yaml``) so users can add
their own hardware or model without touching code: pass a path instead of a name, or put the
files in a directory named by ``SERVETUNE_SIM_PROFILES`` (with ``gpu/`` and ``model/`` inside).
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servetune.strict_yaml import safe_load

BUILTIN_DIR = Path(__file__).parent / "profiles"
ENV_DIR = "SERVETUNE_SIM_PROFILES"
MIB = 1 << 20


class ProfileError(ValueError):
    """A profile name that does not exist or a file that does not validate."""


class GpuProfile(BaseModel):
    """One accelerator: roofline peaks, the share of them reached, and fixed per-step costs."""

    model_config = ConfigDict(extra="forbid")

    name: str
    memory_mib: int = Field(gt=0, description="total device memory as torch reports it (MiB)")
    peak_bf16_tflops: float = Field(gt=0, description="dense bf16 tensor-core peak")
    hbm_bandwidth_gbps: float = Field(gt=0, description="device memory bandwidth, GB/s")
    compute_efficiency: float = Field(gt=0, le=1)
    memory_efficiency: float = Field(gt=0, le=1)
    step_overhead_ms: float = Field(ge=0, description="fixed cost of every forward pass")
    link_bandwidth_gbps: float = Field(default=300, gt=0, description="GPU-GPU link for TP all-reduce")
    allreduce_latency_us: float = Field(default=10, ge=0)
    tdp_w: float = Field(default=400, gt=0)
    idle_w: float = Field(default=60, ge=0)
    # Engine terms an eager (no CUDA graphs) engine needs; the defaults keep the SGLang model.
    kv_traffic_factor: float = Field(
        default=1.0, ge=1,
        description="HBM bytes attention moves per nominal KV-cache byte (cache copies, GQA expansion)"
    )
    launch_ms_per_layer: float = Field(
        default=0.0, ge=0, description="host time to issue one layer's kernels: a pass takes at least layers x this"
    )

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def flops_per_s(self) -> float:
        return self.peak_bf16_tflops * 1e12 * self.compute_efficiency

    @property
    def bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbps * 1e9 * self.memory_efficiency


class VisionProfile(BaseModel):
    """The image encoder of a VLM: how many tokens an image becomes and what encoding costs."""

    model_config = ConfigDict(extra="forbid")

    params_billion: float = Field(gt=0)
    pixels_per_token: int = Field(gt=0)
    min_tokens: int = Field(gt=0)
    max_tokens: int = Field(gt=0)
    overhead_ms: float = Field(default=0.0, ge=0, description="fixed cost of a prefill that encodes images")
    ms_per_image: float = Field(default=0.0, ge=0, description="fixed encoder cost per image beyond its FLOPs")
    host_ms_per_image: float = Field(
        default=0.0, ge=0, description="scheduler's host time per image of a newly admitted request, cached or not")
    marker_tokens: int = Field(
        default=0, ge=0, description="tokens around each image's run (Qwen2-VL: vision start/end, 2)")
    patches_per_token: int = Field(
        default=1, gt=0, description="encoder patches merged into one image token (Qwen2-VL: 4)")

    @model_validator(mode="after")
    def _bounds(self) -> VisionProfile:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"vision.min_tokens ({self.min_tokens}) > vision.max_tokens ({self.max_tokens})")
        return self

    def image_tokens(self, width: int, height: int) -> int:
        """Tokens for one image: one per patch, clamped to the model's bounds (markers not included)."""
        raw = math.ceil(width * height / self.pixels_per_token)
        return max(self.min_tokens, min(self.max_tokens, raw))


class FrontEndProfile(BaseModel):
    """SGLang's front end, before the scheduler sees a request (servetune.sim.frontend; docs/sim.md).

    The defaults (all 0) are no front end: a request reaches the scheduler the instant it is sent.
    """

    model_config = ConfigDict(extra="forbid")

    text_ms: float = Field(default=0.0, ge=0, description="every request: HTTP, template, tokenizer, ZMQ hops")
    text_ms_per_1k_tokens: float = Field(default=0.0, ge=0, description="a text-only request, per 1,000 prompt tokens")
    image_workers_auto: int = Field(default=2, gt=0, description="--mm-processor-worker-num 0: SGLang's auto value")
    image_ms: float = Field(default=0.0, ge=0, description="one image on one worker running alone, fixed part")
    image_ms_per_megapixel: float = Field(default=0.0, ge=0, description="one image on one worker alone, per megapixel")
    image_ms_per_1k_tokens: float = Field(default=0.0, ge=0, description="a request with images on its worker alone,"
                                          " per 1,000 prompt tokens (the processor tokenizes it)")
    worker_contention: float = Field(default=0.0, ge=0, description="service(W) = service(1) x W^this (a shared host)")
    scheduler_contention: float = Field(
        default=0.0, ge=0, description="the scheduler's host time per image (vision.host_ms_per_image) x W^this")


class ModelProfile(BaseModel):
    """A transformer's shape: enough to price a forward pass and size a KV cell."""

    model_config = ConfigDict(extra="forbid")

    name: str
    served_model_name: str
    params_billion: float = Field(gt=0)
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    dtype_bytes: int = Field(default=2, gt=0)
    context_length: int = Field(gt=0)
    tp_size: int = Field(default=1, gt=0, description="default --tp-size")
    attention: Literal["gqa"] = "gqa"
    vision: VisionProfile | None = None
    front_end: FrontEndProfile = Field(default_factory=FrontEndProfile)

    @property
    def weight_bytes(self) -> int:
        return int(self.params_billion * 1e9 * self.dtype_bytes)

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads held by one TP rank (replicated when there are fewer heads than ranks, as SGLang does)."""
        return max(1, self.num_kv_heads // tp)

    def cell_bytes(self, tp: int = 1) -> int:
        """KV-cache bytes per token per rank: kv_heads * (k_dim + v_dim) * layers * dtype (SGLang's KV pool)."""
        return self.kv_heads_per_rank(tp) * (self.head_dim + self.head_dim) * self.num_layers * self.dtype_bytes

    def image_tokens(self, width: int, height: int) -> int:
        if self.vision is None:
            raise ProfileError(f"model profile {self.name!r} has no vision encoder: it cannot take images")
        return self.vision.image_tokens(width, height)


def _search_dirs(kind: str) -> list[Path]:
    dirs = []
    extra = os.environ.get(ENV_DIR)
    if extra:
        dirs.append(Path(extra) / kind)
    dirs.append(BUILTIN_DIR / kind)
    return dirs


def available(kind: Literal["gpu", "model"]) -> list[str]:
    """Profile names that ``load_*_profile`` accepts (user directory first)."""
    names: set[str] = set()
    for d in _search_dirs(kind):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _find(kind: str, name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    for d in _search_dirs(kind):
        candidate = d / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    raise ProfileError(
        f"unknown {kind} profile {name_or_path!r}; available: {', '.join(available(kind))} "
        f"(or a path to a .yaml file, or a directory in ${ENV_DIR})"  # type: ignore[arg-type]
    )


def _load(kind: str, name_or_path: str, cls: type[BaseModel]) -> BaseModel:
    path = _find(kind, name_or_path)
    data = safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a {kind} profile must be a mapping")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{path}: invalid {kind} profile: {exc}") from exc


@lru_cache(maxsize=64)
def load_gpu_profile(name_or_path: str) -> GpuProfile:
    return _load("gpu", name_or_path, GpuProfile)  # type: ignore[return-value]


@lru_cache(maxsize=64)
def load_model_profile(name_or_path: str) -> ModelProfile:
    return _load("model", name_or_path, ModelProfile)  # type: ignore[return-value]
