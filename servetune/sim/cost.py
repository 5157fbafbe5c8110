"""How long one forward pass takes: a per-iteration roofline plus fixed overheads.

Every iteration is priced as ``max(FLOPs / achieved FLOP/s, HBM bytes / achieved bandwidth)``
per tensor-parallel rank, plus the GPU profile's fixed per-step overhead and, with TP > 1, two
all-reduces per layer. Bytes are the weights (read once per pass) and the KV cache read by
attention, so decode is memory-bound at small batches and its cost grows with context; FLOPs
are the linear layers (2 per parameter per token) plus attention (4 x layers x heads x head_dim
per query-key pair), so prefill is compute-bound and quadratic in context. No per-kernel
measurements are involved: this is a model, calibrated only through the profile's factors.

Two optional GPU-profile terms model an eager engine (no CUDA graphs; docs/sim.md, Calibration):
``kv_traffic_factor`` multiplies the KV bytes attention moves, and ``launch_ms_per_layer`` is the
host's kernel-issue time per layer, a floor under the step time when the GPU outruns the host.
Their defaults (1 and 0) leave the SGLang model unchanged.

A VLM's prefill also runs the vision encoder over the images it does not find cached (their FLOPs,
``patches_per_token`` encoder patches per image token, plus ``ms_per_image``), and the scheduler
spends host time on every image it admits, cached or not (``host_ms_per_image``, scaled by the
image processor threads sharing the host): SGLang's overlap scheduler prepares a batch while the
GPU runs, so a prefill step takes the longer of its GPU time and that host time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .args import SimArgs
from .profiles import GpuProfile, ModelProfile


@dataclass(frozen=True, slots=True)
class CostModel:
    flops_per_s: float
    bytes_per_s: float
    overhead_s: float
    body_flops_per_token: float  # linear layers except the LM head, per rank
    head_flops_per_seq: float  # LM head, once per sequence that samples a token
    attn_flops_per_pair: float  # per (query, key) pair, per rank
    weight_bytes: float  # per rank
    cell_bytes: float  # KV bytes per token per rank
    comm_lat_s: float  # two all-reduces per layer: latency part
    comm_s_per_token: float  # and bandwidth part, per token in the batch
    vision_flops_per_token: float
    vision_overhead_s: float
    vision_image_s: float = 0.0  # per image encoded, beyond its FLOPs
    vision_host_s: float = 0.0  # per image admitted (cached or not): the scheduler's host work
    kv_traffic_factor: float = 1.0  # HBM bytes moved per nominal KV byte
    launch_floor_s: float = 0.0  # host kernel-issue time of one pass

    @classmethod
    def from_args(cls, args: SimArgs) -> CostModel:
        return cls.from_profiles(args.model, args.gpu, args.tp_size, args.mm_processor_worker_num)

    @classmethod
    def from_profiles(cls, m: ModelProfile, g: GpuProfile, tp: int = 1, mm_workers: int = 0) -> CostModel:
        """The cost model of ``m`` on ``g`` at tensor-parallel size ``tp`` with ``mm_workers`` image processor
        threads on the host (0: the profile's auto value)."""
        workers = mm_workers or m.front_end.image_workers_auto
        embed = m.vocab_size * m.hidden_size
        body_params = m.params_billion * 1e9 - 2 * embed  # embedding lookup and LM head taken out
        heads_per_rank = m.num_attention_heads / tp
        if tp > 1:
            layers_ar = 2 * m.num_layers
            ring = 2 * (tp - 1) / tp
            comm_lat = layers_ar * g.allreduce_latency_us * 1e-6
            comm_tok = layers_ar * m.hidden_size * m.dtype_bytes * ring / (g.link_bandwidth_gbps * 1e9)
        else:
            comm_lat = comm_tok = 0.0
        v = m.vision
        return cls(
            flops_per_s=g.flops_per_s,
            bytes_per_s=g.bytes_per_s,
            overhead_s=g.step_overhead_ms / 1000,
            body_flops_per_token=2 * body_params / tp,
            head_flops_per_seq=2 * embed / tp,
            attn_flops_per_pair=4 * m.num_layers * heads_per_rank * m.head_dim,
            weight_bytes=m.weight_bytes // tp,
            cell_bytes=m.cell_bytes(tp),
            comm_lat_s=comm_lat,
            comm_s_per_token=comm_tok,
            vision_flops_per_token=2 * v.params_billion * 1e9 * v.patches_per_token if v else 0.0,
            vision_overhead_s=v.overhead_ms / 1000 if v else 0.0,
            vision_image_s=v.ms_per_image / 1000 if v else 0.0,
            vision_host_s=v.host_ms_per_image * workers ** m.front_end.scheduler_contention / 1000 if v else 0.0,
            kv_traffic_factor=g.kv_traffic_factor,
            launch_floor_s=m.num_layers * g.launch_ms_per_layer / 1000,
        )

    def _roofline(self, flops: float, nbytes: float, tokens: int) -> float:
        comm = self.comm_lat_s + self.comm_s_per_token * tokens if self.comm_lat_s else 0.0
        gpu = max(flops / self.flops_per_s, nbytes / self.bytes_per_s) + self.overhead_s + comm
        return max(gpu, self.launch_floor_s)

    def decode_s(self, batch: int, sum_ctx: int) -> float:
        """One decode step: ``batch`` sequences, ``sum_ctx`` tokens of KV cache attended in total."""
        flops = (self.body_flops_per_token + self.head_flops_per_seq) * batch + self.attn_flops_per_pair * sum_ctx
        nbytes = self.weight_bytes + self.kv_traffic_factor * self.cell_bytes * (sum_ctx + batch)
        return self._roofline(flops, nbytes, batch)

    def extend_s(self, new_tokens: int, pairs: float, ctx_read: int, seqs: int, vision_tokens: int = 0,
                 images: int = 0) -> float:
        """One prefill (extend) pass over ``new_tokens`` new tokens of ``seqs`` sequences, on the GPU.

        ``pairs``: attended (query, key) pairs, sum of new * (prefix + (new + 1) / 2);
        ``ctx_read``: cached prefix tokens whose KV is read; ``vision_tokens``: image tokens
        that the vision encoder has to encode first (images not found in the cache), ``images``
        of them.
        """
        flops = (
            self.body_flops_per_token * new_tokens
            + self.head_flops_per_seq * seqs
            + self.attn_flops_per_pair * pairs
        )
        nbytes = self.weight_bytes + self.kv_traffic_factor * self.cell_bytes * (ctx_read + new_tokens)
        t = self._roofline(flops, nbytes, new_tokens)
        if vision_tokens:
            t += (self.vision_flops_per_token * vision_tokens / self.flops_per_s + self.vision_overhead_s
                  + self.vision_image_s * images)
        return t

    def host_s(self, admitted_images: int) -> float:
        """The scheduler's host time to admit requests carrying ``admitted_images`` images, cached or not
        (their multimodal inputs). SGLang's overlap scheduler prepares a batch while the GPU runs the
        previous one, so a step takes the longer of this and its GPU time."""
        return self.vision_host_s * admitted_images
