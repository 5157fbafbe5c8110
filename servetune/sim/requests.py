"""What the simulated scheduler works on and reports: requests, iterations, cumulative counters.

Plain data, apart from the scheduler (servetune.sim.scheduler) so drivers, metrics and logs can
name them without the scheduling logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import tokens as tk
from .radix import Node


class RequestRejected(ValueError):
    """A request SGLang would refuse outright (HTTP 400), e.g. longer than the context."""


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: int
    tokens: list  # prompt token ids: template pieces, words (str) and image pads
    max_new: int
    images: list[tuple[int, int]] = field(default_factory=list)  # (start, length) of image token runs
    arrival: float = 0.0  # when the scheduler queued it (after the front end): queue time starts here
    plen: int = 0  # len(tokens), set when added
    # state
    fill: list = field(default_factory=list)  # tokens to hold KV for: prompt (+ output after retraction)
    output_len: int = 0
    done_len: int = 0  # tokens of ``fill`` whose KV is computed
    own: int = 0  # KV slots held outside the radix tree
    node: Node | None = None  # locked tree node (prefix)
    cached_tokens: int | None = None  # prefix hit at first admission
    admitted: bool = False
    retractions: int = 0
    out_base: int = 0  # output_len when it joined the running batch
    step_base: int = 0  # decode step counter when it joined
    finish_step: int = -1  # decode step whose token completes it
    token_times: list[float] = field(default_factory=list)  # modelled time of each output token
    first_scheduled: float | None = None
    finished_at: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)

    def output_tokens(self, start: int, end: int) -> list:
        """Token ids of output tokens [start, end): the words the server streams back (tokens.output_word),
        so a later turn that carries the answer in its history finds it in the radix cache, as on SGLang."""
        return [tk.token_id(tk.output_word(self.rid, k)) for k in range(start, end)]


@dataclass(slots=True)
class Iteration:
    start: float
    end: float
    kind: str  # "prefill" | "decode"
    emitted: list[SimRequest]  # requests that received a token at ``end``
    finished: list[SimRequest]
    retracted: list[SimRequest]
    batch_size: int
    new_tokens: int  # prefill tokens computed (0 for decode)
    cached_tokens: int  # prefix tokens reused by requests admitted in this batch


@dataclass(slots=True)
class Stats:
    """Cumulative counters the /metrics exposition and the server samples are built from."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests_finished: int = 0
    prefill_compute_tokens: int = 0
    prefill_cache_tokens: int = 0
    decode_tokens: int = 0
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    evicted_tokens: int = 0
    last_retracted: int = 0
    last_cache_hit_rate: float = 0.0  # the (misleading) per-prefill-batch gauge
    busy_s: float = 0.0
    iterations: int = 0
