"""SGLang-compatible launch flags and their defaults, resolved the way SGLang 0.5.x resolves them.

``servetune sim serve`` parses its argv with the parser built here, so flags, their spelling,
and the rejection of unknown ones (argparse: exit code 2, "unrecognized arguments") are the same
as ``python -m sglang.launch_server``. Defaults that SGLang derives from the GPU's memory
(chunked prefill size, mem-fraction-static, KV pool, max running requests) are derived from the
GPU profile with SGLang's formulas (docs/sim.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from .profiles import GpuProfile, ModelProfile, load_gpu_profile, load_model_profile

SGLANG_VERSION_MODELLED = "0.5.23"
SCHEDULE_POLICIES = ("fcfs", "lpm")  # the two policies modelled; SGLang has more
DEFAULT_MODEL_PROFILE = "llama-3.1-8b"
DEFAULT_GPU_PROFILE = "A100-80G"
RETRACT_DECODE_STEPS = 20  # SGLang global_config.retract_decode_steps
CLIP_MAX_NEW_TOKENS = 4096  # SGLang's cap on a request's reserved new tokens at admission


class SimArgsError(ValueError):
    """Flags that SGLang would refuse (or a KV pool that does not fit)."""


def build_parser(prog: str = "servetune sim serve") -> argparse.ArgumentParser:
    """SGLang's flags (the modelled subset) plus the simulator's own (profiles, load time, seed)."""
    p = argparse.ArgumentParser(prog=prog, description="Start the simulated SGLang server (a model, not a"
                                " measurement): SGLang's flags plus the simulator's profiles. Parsed and shown"
                                " as SGLang's own `python -m sglang.launch_server` does (argparse), so a launch"
                                " line runs unchanged against either.")
    sim = p.add_argument_group("simulator")
    sim.add_argument("--model-profile", default=DEFAULT_MODEL_PROFILE, help="model profile name or YAML path")
    sim.add_argument("--gpu-profile", default=DEFAULT_GPU_PROFILE, help="GPU profile name or YAML path")
    sim.add_argument("--load-seconds", type=float, default=0.5, help="simulated weight-loading time (503s)")
    sg = p.add_argument_group("SGLang server arguments")
    sg.add_argument("--model-path", "--model", default=None, dest="model_path",
                    help="model name reported by the API (default: profile's)")
    sg.add_argument("--served-model-name", default=None,
                    help="the name clients send as 'model' (default: --model-path)")
    sg.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=None, dest="tp_size",
                    help="tensor-parallel GPUs (default: the model profile's)")
    sg.add_argument("--context-length", type=int, default=None, help="longest prompt + output (default: the model's)")
    sg.add_argument("--max-running-requests", type=int, default=None,
                    help="cap on the decode batch (default: from the KV pool, as SGLang)")
    sg.add_argument("--max-total-tokens", type=int, default=None,
                    help="KV pool size in tokens (default: from --mem-fraction-static)")
    sg.add_argument("--chunked-prefill-size", type=int, default=None,
                    help="longest prefill chunk in tokens (default: SGLang's for the GPU)")
    sg.add_argument("--max-prefill-tokens", type=int, default=16384, help="tokens one prefill batch may hold")
    sg.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default="fcfs",
                    help="queue order: first come, or longest cached prefix first")
    sg.add_argument("--schedule-conservativeness", type=float, default=1.0,
                    help="how much KV room new requests must leave for decodes (lower admits more)")
    sg.add_argument("--mem-fraction-static", type=float, default=None,
                    help="share of GPU memory for weights and the KV pool (default: SGLang's for the GPU)")
    sg.add_argument("--page-size", type=int, default=1, help="tokens per KV page")
    sg.add_argument("--disable-radix-cache", action="store_true", help="no prefix reuse between requests")
    sg.add_argument("--mm-processor-worker-num", type=int, default=0,
                    help="image processor threads of the front end (0: the model profile's auto value)")
    sg.add_argument("--enable-metrics", action="store_true", help="serve Prometheus /metrics")
    sg.add_argument("--enable-cache-report", action="store_true",
                    help="report cached prompt tokens in each response's usage")
    sg.add_argument("--random-seed", type=int, default=0, help="seed of the generated tokens")
    sg.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    sg.add_argument("--port", type=int, default=30000, help="port to listen on")
    sg.add_argument("--api-key", default=None, help="a bearer token clients must send, as SGLang's --api-key")
    sg.add_argument("--log-level", default="info", help="the server's log level")
    return p


class SimArgs(BaseModel):
    """Resolved server arguments (what ``/server_info`` reports) plus the derived pool sizes."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model_profile: str
    gpu_profile: str
    load_seconds: float
    model_path: str
    served_model_name: str
    tp_size: int
    context_length: int
    max_running_requests: int
    max_total_tokens: int | None  # the flag as given
    max_total_num_tokens: int  # the KV pool actually allocated (tokens)
    chunked_prefill_size: int  # <= 0: chunking disabled
    max_prefill_tokens: int
    schedule_policy: str
    schedule_conservativeness: float
    mem_fraction_static: float
    page_size: int
    disable_radix_cache: bool
    mm_processor_worker_num: int  # the flag as given; 0 = the model profile's front_end.image_workers_auto
    enable_metrics: bool
    enable_cache_report: bool
    random_seed: int
    host: str
    port: int
    api_key: str | None
    log_level: str
    cuda_graph_max_bs: int
    # derived
    cell_size_bytes: int  # KV bytes per token per rank
    weight_bytes_per_rank: int
    kv_pool_bytes_per_rank: int
    gpu_memory_bytes: int
    init_new_token_ratio: float
    min_new_token_ratio: float
    new_token_ratio_decay: float

    @property
    def model(self) -> ModelProfile:
        return load_model_profile(self.model_profile)

    @property
    def gpu(self) -> GpuProfile:
        return load_gpu_profile(self.gpu_profile)

    @property
    def chunking(self) -> bool:
        return self.chunked_prefill_size > 0

    def server_args(self) -> dict[str, Any]:
        """The resolved args as ``/server_info`` shows them (secrets withheld)."""
        d = self.model_dump()
        d["api_key"] = None if self.api_key is None else "***"
        return d


def _default_chunked_prefill(gpu_mem_mib: int) -> int:
    if gpu_mem_mib < 20 * 1024:
        return 2048
    if gpu_mem_mib < 60 * 1024:
        return 4096
    if gpu_mem_mib < 160 * 1024:
        return 8192
    return 16384


def _default_cuda_graph_max_bs(gpu_mem_mib: int, tp: int) -> int:
    if gpu_mem_mib < 20 * 1024:
        return 8
    if gpu_mem_mib < 35 * 1024:
        return 24 if tp < 4 else 80
    if gpu_mem_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def _default_mem_fraction(gpu_mem_mib: int, chunk: int, max_prefill: int, graph_bs: int, tp: int) -> float:
    """SGLang's reserve for activations, CUDA graphs and TP buffers, as a fraction of the GPU (MiB)."""
    reserved = 512.0
    reserved += max(chunk if chunk > 0 else max_prefill, 2048) * 1.5
    reserved += graph_bs * 2
    reserved += tp / 8 * 1024
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def resolve(ns: argparse.Namespace | Mapping[str, Any]) -> SimArgs:
    """Parsed flags -> SimArgs with every default filled in; SimArgsError for what SGLang refuses."""
    a = dict(vars(ns)) if isinstance(ns, argparse.Namespace) else dict(ns)
    model = load_model_profile(a["model_profile"])
    gpu = load_gpu_profile(a["gpu_profile"])
    tp = model.tp_size if a.get("tp_size") is None else int(a["tp_size"])
    if tp < 1:  # SGLang divides by it; 0 is no "default"
        raise SimArgsError(f"--tp-size must be >= 1, got {tp}")
    if tp <= 0:
        raise SimArgsError(f"--tp-size must be positive, got {tp}")
    gpu_mib = gpu.memory_mib
    chunk = a.get("chunked_prefill_size")
    chunk = _default_chunked_prefill(gpu_mib) if chunk is None else (chunk if chunk > 0 else -1)
    max_prefill = a.get("max_prefill_tokens") or 16384
    graph_bs = _default_cuda_graph_max_bs(gpu_mib, tp)
    frac = a.get("mem_fraction_static")
    if frac is None:
        frac = _default_mem_fraction(gpu_mib, chunk, max_prefill, graph_bs, tp)
    if not 0 < frac < 1:
        raise SimArgsError(f"--mem-fraction-static must be in (0, 1), got {frac}")
    mm_workers = int(a.get("mm_processor_worker_num") or 0)
    if mm_workers < 0:
        raise SimArgsError(f"--mm-processor-worker-num must be >= 0 (0: auto), got {mm_workers}")
    cons = float(a.get("schedule_conservativeness", 1.0))
    if cons < 0:  # 0 is SGLang's own edge: no decode reserve at admission
        raise SimArgsError(f"--schedule-conservativeness must be non-negative, got {cons}")

    cell = model.cell_bytes(tp)
    weights = model.weight_bytes // tp
    gpu_bytes = gpu.memory_bytes
    rest = int(gpu_bytes * frac) - weights
    if rest <= 0:
        raise SimArgsError(
            f"Not enough memory. Please try to increase --mem-fraction-static "
            f"(weights {weights / 2**30:.1f} GiB per rank > {frac} x {gpu_bytes / 2**30:.1f} GiB)"
        )
    pool = rest // cell
    if a.get("max_total_tokens") is not None:
        pool = min(pool, int(a["max_total_tokens"]))
    if pool <= 0:
        raise SimArgsError(f"the KV pool holds no token (max_total_num_tokens={pool})")

    ctx = a.get("context_length") or model.context_length
    mrr = a.get("max_running_requests")
    if mrr is None:
        mrr = min(max(int(pool / ctx * 512), 2048), 4096)
    mrr = max(1, min(int(mrr), pool // 2 if pool >= 2 else 1))

    init_ratio = min(0.7 * cons, 1.0)
    min_ratio = min(init_ratio * 0.14, 1.0)
    served = a.get("served_model_name") or a.get("model_path") or model.served_model_name
    return SimArgs(
        model_profile=a["model_profile"],
        gpu_profile=a["gpu_profile"],
        load_seconds=float(a.get("load_seconds", 0.5)),
        model_path=a.get("model_path") or model.served_model_name,
        served_model_name=served,
        tp_size=tp,
        context_length=ctx,
        max_running_requests=mrr,
        max_total_tokens=a.get("max_total_tokens"),
        max_total_num_tokens=int(pool),
        chunked_prefill_size=chunk,
        max_prefill_tokens=max_prefill,
        schedule_policy=a.get("schedule_policy") or "fcfs",
        schedule_conservativeness=cons,
        mem_fraction_static=frac,
        page_size=a.get("page_size") or 1,
        disable_radix_cache=bool(a.get("disable_radix_cache")),
        mm_processor_worker_num=mm_workers,
        enable_metrics=bool(a.get("enable_metrics")),
        enable_cache_report=bool(a.get("enable_cache_report")),
        random_seed=int(a.get("random_seed") or 0),
        host=a.get("host") or "127.0.0.1",
        port=int(a.get("port") or 30000),
        api_key=a.get("api_key"),
        log_level=a.get("log_level") or "info",
        cuda_graph_max_bs=graph_bs,
        cell_size_bytes=cell,
        weight_bytes_per_rank=weights,
        kv_pool_bytes_per_rank=int(pool) * cell,
        gpu_memory_bytes=gpu_bytes,
        init_new_token_ratio=init_ratio,
        min_new_token_ratio=min_ratio,
        new_token_ratio_decay=(init_ratio - min_ratio) / 600,
    )


def parse_argv(argv: Sequence[str]) -> SimArgs:
    """argv -> SimArgs; bad flags exit 2 like SGLang's argparse, bad values raise SimArgsError."""
    return resolve(build_parser().parse_args(list(argv)))


def _flag_dests() -> dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions if a.dest != "help"}


def modelled(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The flags the simulator models; the others (attention backend, sampling backend...) are left out
    when a real SGLang plan is only being estimated."""
    dests = _flag_dests()
    return {k: v for k, v in flags.items() if k.lstrip("-").replace("-", "_") in dests}


def server_args_from_flags(flags: Mapping[str, Any] | SimArgs | None = None) -> SimArgs:
    """``{"chunked_prefill_size": 4096, ...}`` (SGLang flag names, dashes or underscores) -> SimArgs.

    Profiles default to the 8B model on an A100-80G; unknown keys raise SimArgsError naming them.
    """
    if isinstance(flags, SimArgs):
        return flags
    dests = _flag_dests()
    values: dict[str, Any] = {d: act.default for d, act in dests.items()}
    unknown = []
    for key, value in (flags or {}).items():
        k = key.lstrip("-").replace("-", "_")
        k = {"tp": "tp_size", "tensor_parallel_size": "tp_size", "model": "model_path"}.get(k, k)
        if k not in dests:
            unknown.append(key)
            continue
        act = dests[k]
        if value is not None and act.type is not None and not isinstance(value, bool):
            try:
                value = act.type(value)
            except (TypeError, ValueError) as exc:
                raise SimArgsError(f"flag {key!r}: {value!r} is not a valid {act.type.__name__}") from exc
        if act.choices is not None and value is not None and value not in act.choices:
            raise SimArgsError(f"flag {key!r}: {value!r} is not one of {list(act.choices)}")
        values[k] = value
    if unknown:
        raise SimArgsError(f"unrecognized SGLang flags: {', '.join(map(str, unknown))}")
    return resolve(values)
