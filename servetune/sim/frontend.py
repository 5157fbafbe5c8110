"""SGLang's front end: what a request passes through before the scheduler sees it.

On SGLang the HTTP server and the tokenizer manager apply the chat template and tokenize every
request, and a request with images then waits for the multimodal processor: a pool of
``--mm-processor-worker-num`` threads (0: the model's auto value, 2 for Qwen-VL) that decode,
resize and normalise each image, whether the radix cache holds it or not. On a real H200 host this
pool, not the GPU, limited a VLM server with the radix cache on, and 8 threads were slower than 2
(docs/gpu.md): the threads share the host's CPU. The model, shared by both drivers:

* every request waits ``text_ms`` (HTTP, template, the hops to the scheduler and back), each on its
  own (no queue); a text-only request is tokenized there too, ``text_ms_per_1k_tokens`` per 1,000
  prompt tokens;
* a request with images then takes the first free of W workers, in the order sent, and holds it
  while the processor tokenizes its prompt and prepares its images, one after the other:
  ``(image_ms_per_1k_tokens x prompt / 1000 + sum of image_ms + image_ms_per_megapixel x megapixels)
  x W^worker_contention`` (one worker alone costs the bracket; W workers on one host each run slower).

The time spent here counts in the server's TTFT and not in the scheduler's queue time, as on SGLang
(``sglang:queue_time_seconds`` starts when the scheduler queues the request). The profile's defaults
(0 ms) are no front end: a request reaches the scheduler the instant it is sent.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .args import SimArgs
from .profiles import FrontEndProfile


class FrontEnd:
    """The tokenizer stage and the image processor pool of one server; ``ready_at`` books a request."""

    def __init__(self, profile: FrontEndProfile, workers: int):
        if workers < 1:
            raise ValueError(f"the image processor needs at least one worker, got {workers}")
        self.profile = profile
        self.workers = workers
        self.slowdown = workers ** profile.worker_contention  # each of W workers sharing the host
        self._free = [0.0] * workers  # heap: when each worker is next free

    @classmethod
    def from_args(cls, args: SimArgs) -> FrontEnd:
        """``args``' model profile's front end with ``--mm-processor-worker-num`` W (0: the profile's auto)."""
        fe = args.model.front_end
        return cls(fe, args.mm_processor_worker_num or fe.image_workers_auto)

    def image_s(self, prompt_tokens: int, pixels: Sequence[int]) -> float:
        """One worker's time for a request with images, with W workers sharing the host."""
        p = self.profile
        one = p.image_ms_per_1k_tokens * prompt_tokens / 1000.0
        one += sum(p.image_ms + p.image_ms_per_megapixel * px / 1e6 for px in pixels)
        return one * self.slowdown / 1000.0

    def ready_at(self, t: float, prompt_tokens: int, pixels: Sequence[int] = ()) -> float:
        """When a request sent at ``t`` reaches the scheduler. Requests must be booked in the order sent."""
        p = self.profile
        if not pixels:
            return t + (p.text_ms + p.text_ms_per_1k_tokens * prompt_tokens / 1000.0) / 1000.0
        start = max(t + p.text_ms / 1000.0, heapq.heappop(self._free))
        end = start + self.image_s(prompt_tokens, pixels)
        heapq.heappush(self._free, end)
        return end
