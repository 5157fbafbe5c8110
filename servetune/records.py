"""One RequestRecord per request sent: the raw material every summary is computed from.

Timings follow docs/metrics.md: all offsets are
measured with ``time.perf_counter_ns`` and stored in milliseconds relative to the
request's own ``t_send``; ``t_send_s`` is relative to the trial's start (``t0``).
Records are plain slotted dataclasses (not pydantic) because a trial can hold a
million of them and they are created on the hot path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class ErrorClass(StrEnum):
    """Why a request failed; one value per request, never an aborted run."""

    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    REJECTED_503 = "rejected_503"
    TIMEOUT = "timeout"
    IDLE_TIMEOUT = "idle_timeout"  # the stream sent no byte for idle_timeout_s (servetune.loadgen.idle)
    CONNECTION = "connection"  # refused, reset, closed mid-stream
    MALFORMED = "malformed_sse"
    TOO_LARGE = "response_too_large"  # past MAX_RESPONSE_BYTES (servetune.loadgen.bounded): cut, not buffered
    EMPTY = "empty_response"  # stream ended without any generated text
    CANCELLED = "cancelled"  # still in flight when the run was drained/stopped
    CLIENT = "client_error"  # a bug or resource problem on our side


class TokenCountSource(StrEnum):
    """Where per-chunk token counts came from (best first, docs/metrics.md)."""

    META_INFO = "meta_info"  # SGLang /generate meta_info.completion_tokens growth
    USAGE_PER_CHUNK = "usage_per_chunk"  # usage attached to every chunk
    TOKENIZER = "tokenizer"  # chunk text re-tokenised with the model's tokenizer
    APPORTIONED = "apportioned"  # final usage.completion_tokens spread evenly over chunks
    CHUNKS = "chunks"  # no usage at all: one token per content chunk (flagged)


@dataclass(slots=True)
class RequestRecord:
    request_id: int
    t_send_s: float = 0.0  # relative to the trial's t0
    queue_ms: float = 0.0  # waiting for a concurrency slot / behind schedule
    ttft_ms: float | None = None  # t_send -> first chunk with non-empty generated text
    e2e_ms: float | None = None  # t_send -> end of stream (partial for failures)
    chunk_offsets_ms: list[float] = field(default_factory=list)  # content-chunk arrivals, rel. t_send
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each content chunk
    token_count_source: str | None = None
    prompt_tokens: int | None = None  # from server usage
    completion_tokens: int | None = None  # from server usage
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens / meta_info
    client_completion_tokens: int | None = None  # re-tokenised count, when a tokenizer is available
    requested_input_tokens: int | None = None
    requested_output_tokens: int | None = None
    prefix_group: int | None = None  # which shared system prompt the request used (-1: none)
    n_images: int = 0
    text_before_images: int | None = None  # requested text tokens ahead of the images (None: no images)
    payload_bytes: int | None = None  # the request body as sent (base64 images make it large)
    turn: int = 0
    session: int = -1  # multi-turn sessions: the user's session (the load unit) the turn belongs to (-1: none)
    warmup: bool = False
    http_status: int | None = None
    error_class: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def output_tokens(self) -> int | None:
        """Server-reported output tokens, else the sum of per-chunk counts."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(self.chunk_tokens) if self.chunk_tokens else None

    def itl_gaps_ms(self) -> list[float]:
        """Per-token inter-token latencies: a chunk carrying k tokens gives k gaps of gap/k."""
        gaps: list[float] = []
        offs, toks = self.chunk_offsets_ms, self.chunk_tokens
        for i in range(1, len(offs)):
            k = toks[i] if i < len(toks) and toks[i] > 0 else 1
            g = (offs[i] - offs[i - 1]) / k
            gaps.extend([g] * k)
        return gaps

    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1), output tokens from server usage."""
        out = self.output_tokens
        if self.ttft_ms is None or self.e2e_ms is None or out is None or out < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (out - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        names = _RECORD_FIELDS
        return cls(**{k: v for k, v in d.items() if k in names})


_RECORD_FIELDS = frozenset(f.name for f in fields(RequestRecord))
