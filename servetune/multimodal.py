"""What a trial with images measures beyond text: image tokens, the prefix hit rate split into image and
text tokens, request payloads, and where a request's first token waits (docs/metrics.md, "Images").

Image tokens come from the server's usage, not from a formula: a request's prompt tokens minus its requested
text tokens minus the chat template's own tokens, measured on the same trial's text-only requests (their
prompt tokens minus their requested tokens; 0 when every request has images, said in ``template_source``).
The hit-rate split places a request's cached tokens on its prompt as sent: the text ahead of its images
(``RequestRecord.text_before_images``, from the image position), then its images, then the rest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from servetune.records import RequestRecord


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextAndImage(_Figures):
    """One figure for the text-only requests and one for those with images."""

    text: float | None = None
    image: float | None = None


class TtftByKind(TextAndImage):
    """Median TTFT by kind of request; an image request "hit" when the cache covered half its image tokens."""

    image_hit: float | None = None
    image_miss: float | None = None


class TtftBreakdown(_Figures):
    """Where the mean first token waits, ms (``ttft_breakdown``); ``dominant`` names the largest part."""

    client_ttft_mean: float
    server_ttft_mean: float
    queue: float | None = None
    in_server_after_queue: float
    outside_server: float
    dominant: str | None = None


class MultimodalSummary(_Figures):
    """``TrialSummary.multimodal``: the figures of a trial with images (module docstring)."""

    image_requests: int
    text_requests: int
    images_per_request_mean: float
    image_tokens_per_image_p50: float | None = None
    image_token_share: float | None = None
    template_tokens: float
    template_source: str
    hit_rate_image_tokens: float | None = None
    hit_rate_text_tokens: float | None = None
    split_requests: int
    payload_bytes_p50: TextAndImage
    payload_bytes_max: int
    ttft_p50_ms: TtftByKind
    ttft_p99_ms: TextAndImage
    ttft_breakdown_ms: TtftBreakdown | None = None


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _p(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    return float(ys[min(len(ys) - 1, int(q * len(ys)))])


def image_tokens(r: RequestRecord, template: float) -> int | None:
    """The request's image tokens as the server counted them (None: no images or no usage)."""
    if not r.n_images or r.prompt_tokens is None or r.requested_input_tokens is None:
        return None
    return max(int(round(r.prompt_tokens - r.requested_input_tokens - template)), 0)


def cached_split(r: RequestRecord, images: int) -> tuple[int, int] | None:
    """(cached image tokens, cached text tokens) of one image request: its cached prefix laid over text
    ahead of the images, the images, then the rest of its text."""
    if r.cached_tokens is None or r.text_before_images is None:
        return None
    k = r.cached_tokens
    on_images = min(max(k - r.text_before_images, 0), images)
    return on_images, k - on_images


def summarize_images(ok: Sequence[RequestRecord],
                     server_signals: dict[str, Any] | None = None) -> MultimodalSummary | None:
    """The multimodal figures of a trial's successful requests in the window (None without images)."""
    image = [r for r in ok if r.n_images]
    if not image:
        return None
    text = [r for r in ok if not r.n_images]
    overheads = [r.prompt_tokens - r.requested_input_tokens for r in text
                 if r.prompt_tokens is not None and r.requested_input_tokens is not None]
    template = _median(overheads) or 0.0
    tokens = {id(r): t for r in image if (t := image_tokens(r, template)) is not None}
    splits = {k: sp for r in image if (k := id(r)) in tokens and (sp := cached_split(r, tokens[k])) is not None}
    prompt_all = sum(r.prompt_tokens or 0 for r in ok)
    img_total = sum(tokens.values())
    split = [r for r in image if id(r) in splits]
    cached_img = sum(splits[id(r)][0] for r in split)
    cached_txt = sum(splits[id(r)][1] for r in split) + sum(r.cached_tokens or 0 for r in text)
    img_split_total = sum(tokens[id(r)] for r in split)
    txt_split_total = (sum((r.prompt_tokens or 0) - tokens[id(r)] for r in split)
                       + sum(r.prompt_tokens or 0 for r in text))
    split_n = len(split)
    per_image = [t / r.n_images for r in image if (t := tokens.get(id(r))) is not None]
    # an image request "hit" its images when the cache covered at least half of their tokens
    hit = [r for r in split if splits[id(r)][0] >= 0.5 * tokens[id(r)] > 0]
    hit_ids = {id(r) for r in hit}
    miss = [r for r in image
            if id(r) not in hit_ids and r.text_before_images is not None and r.cached_tokens is not None]
    sig = server_signals or {}
    return MultimodalSummary(**{
        "image_requests": len(image),
        "text_requests": len(text),
        "images_per_request_mean": sum(r.n_images for r in image) / len(image),
        "image_tokens_per_image_p50": _median(per_image),
        "image_token_share": _ratio(img_total, prompt_all),
        "template_tokens": template,
        "template_source": "text requests" if overheads else "none: every request has images (taken as 0)",
        "hit_rate_image_tokens": _ratio(cached_img, img_split_total) if split_n else None,
        "hit_rate_text_tokens": _ratio(cached_txt, txt_split_total) if split_n or text else None,
        "split_requests": split_n,
        "payload_bytes_p50": {"image": _p([r.payload_bytes for r in image if r.payload_bytes], 0.5),
                              "text": _p([r.payload_bytes for r in text if r.payload_bytes], 0.5)},
        "payload_bytes_max": max((r.payload_bytes or 0 for r in ok), default=0),
        "ttft_p50_ms": {k: _p([r.ttft_ms for r in rs if r.ttft_ms is not None], 0.5)
                        for k, rs in (("text", text), ("image", image), ("image_hit", hit), ("image_miss", miss))},
        "ttft_p99_ms": {k: _p([r.ttft_ms for r in rs if r.ttft_ms is not None], 0.99)
                        for k, rs in (("text", text), ("image", image))},
        "ttft_breakdown_ms": ttft_breakdown(ok, sig),
    })


def ttft_breakdown(ok: Sequence[RequestRecord], sig: dict[str, Any]) -> TtftBreakdown | None:
    """Where the mean first token waits, from the server's own histograms over the trial: the scheduler's
    queue, then the rest inside the server (front end: tokenizing and image preprocessing; the vision
    encoder and the prefill), and outside it (client, HTTP, JSON). None without the server's TTFT."""
    client = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    server_ttft, queue = sig.get("server_ttft_mean_s"), sig.get("server_queue_mean_s")
    if not client or server_ttft is None:
        return None
    mean = sum(client) / len(client)
    parts = {"client_ttft_mean": mean, "server_ttft_mean": server_ttft * 1e3,
             "queue": queue * 1e3 if queue is not None else None,
             "in_server_after_queue": (server_ttft - (queue or 0.0)) * 1e3,
             "outside_server": max(mean - server_ttft * 1e3, 0.0)}
    named = {k: v for k, v in parts.items() if k in ("queue", "in_server_after_queue", "outside_server") and v}
    parts["dominant"] = max(named, key=named.get) if named else None  # type: ignore[arg-type]
    return TtftBreakdown(**parts)
