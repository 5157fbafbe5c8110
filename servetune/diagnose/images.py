"""Rule 6: a trial with images: where its first token waits, and what the prefix cache kept of images and text.

The figures are ``summary.multimodal`` (servetune.multimodal); a result measured before that section existed
gets it from its own records and server scrapes. SGLang's multimodal front end preprocesses every image,
cached or not, before the scheduler sees the request: a TTFT dominated by the server's time after its queue
with the queue empty points there (or at the vision encoder and the prefill), not at the KV pool.
"""

from __future__ import annotations

from typing import Any

from servetune.diagnose import Finding, r3
from servetune.multimodal import MultimodalSummary
from servetune.result import TrialResult

WHERE = {"queue": "in the scheduler's queue",
         "in_server_after_queue": "in the server after its queue (front end, vision encoder, prefill)",
         "outside_server": "outside the server"}
ADVICE = {
    "queue": "requests wait in the scheduler's queue: the level is past what the server admits; offer less load,"
             " or raise --max-running-requests / --chunked-prefill-size if memory allows (rule 5 says which)",
    "in_server_after_queue": "the time goes inside the server outside its queue: the front end's image preprocessing"
                             " (every image, cached or not), the vision encoder and the prefill; smaller images or"
                             " fewer per request cut it, and SGLang's --mm-processor-worker-num changes the front"
                             " end's parallelism (measure it: more workers were slower on a 16-core host)",
    "outside_server": "the time goes outside the server: HTTP, JSON and the client; large base64 payloads cost"
                      " here (serve images by URL instead), or the client lags (see client_lag_p99_ms)",
}


def multimodal(result: TrialResult) -> MultimodalSummary | None:
    """The trial's multimodal figures, recomputed from its records and scrapes when the summary predates them."""
    if result.summary.multimodal is not None:
        return result.summary.multimodal
    from servetune.multimodal import summarize_images
    from servetune.telemetry.prometheus import derive_signals

    s = result.summary
    ok = [r for r in result.records if r.ok and not r.warmup]
    if s.window_start_s is not None and s.window_end_s is not None:
        ok = [r for r in ok
              if r.e2e_ms is not None and s.window_start_s < r.t_send_s + r.e2e_ms / 1e3 <= s.window_end_s]
    return summarize_images(ok, derive_signals(result.server) if result.server else None)


def diagnose(result: TrialResult) -> list[Finding]:
    mm = multimodal(result)
    if mm is None:
        return []
    tid, out = result.trial_id, []
    ttft = mm.ttft_p50_ms
    ev: dict[str, Any] = {k: r3(getattr(mm, k)) for k in ("image_token_share", "hit_rate_image_tokens",
                                                           "hit_rate_text_tokens", "image_tokens_per_image_p50")}
    ev.update({f"ttft_p50_ms_{k}": r3(v) for k, v in ttft.model_dump().items()})
    parts = mm.ttft_breakdown_ms
    if parts and parts.dominant:
        top = parts.dominant
        shares = {k: r3(getattr(parts, k)) for k in ("queue", "in_server_after_queue", "outside_server")}
        out.append(Finding(
            trial_id=tid, kind=f"images.ttft_{top}", severity="info",
            evidence={**ev, **shares, "client_ttft_mean_ms": r3(parts.client_ttft_mean)},
            summary=f"the first token waits mostly {WHERE[top]}: {getattr(parts, top):.0f} of"
                    f" {parts.client_ttft_mean:.0f} ms mean TTFT (queue {_ms(parts.queue)},"
                    f" in the server after the queue {_ms(parts.in_server_after_queue)},"
                    f" outside the server {_ms(parts.outside_server)})",
            advice=ADVICE[top]))
    hit_img, hit_txt = mm.hit_rate_image_tokens, mm.hit_rate_text_tokens
    if hit_img is not None and hit_txt is not None:
        out.append(Finding(
            trial_id=tid, kind="images.cache_split", severity="info", evidence=ev,
            summary=f"the prefix cache kept {hit_img:.0%} of image tokens and {hit_txt:.0%} of text tokens; image"
                    f" requests' TTFT p50 {_ms(ttft.image_hit)} when their images hit,"
                    f" {_ms(ttft.image_miss)} when not (text {_ms(ttft.text)})",
            advice=None if hit_img >= hit_txt else
            "images are reused less than text: repeated images behind a shared system prompt hit only when nothing"
            " before them differs (an image placed before the system prompt breaks the shared prefix)"))
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} ms"
