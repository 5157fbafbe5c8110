"""The report's "Images" section: what each trial with images measured (``summary.multimodal``)."""

from __future__ import annotations

from typing import Any

from servetune.report.campaign import CampaignView, level_of


def _f(x: Any, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def image_rows(campaign: CampaignView) -> list[dict[str, str]]:
    """A row per trial whose requests carried images (none: the section is left out)."""
    from servetune.diagnose.images import WHERE, multimodal

    rows = []
    for t in campaign.trials:
        mm = multimodal(t)
        if not mm:
            continue
        ttft, parts, pay = mm.ttft_p50_ms, mm.ttft_breakdown_ms, mm.payload_bytes_p50
        rows.append({
            "trial_id": t.trial_id, "stage": t.stage or "bench",
            "level": "-" if level_of(t) is None else f"{level_of(t):g}",
            "image_requests": f"{mm.image_requests} / {mm.image_requests + mm.text_requests}",
            "tokens_per_image": _f(mm.image_tokens_per_image_p50),
            "share": _f(mm.image_token_share, "{:.0%}"),
            "hit": f"{_f(mm.hit_rate_image_tokens, '{:.0%}')} / {_f(mm.hit_rate_text_tokens, '{:.0%}')}",
            "ttft": " / ".join(_f(x) for x in (ttft.text, ttft.image_hit, ttft.image_miss)),
            "payload": f"{_f(pay.image / 1024 if pay.image else None)} /"
                       f" {_f(pay.text / 1024 if pay.text else None, '{:.1f}')}",
            "breakdown": " / ".join(_f(x) for x in ((parts.queue, parts.in_server_after_queue, parts.outside_server)
                                                     if parts else (None, None, None))),
            "dominant": WHERE.get(parts.dominant or "", "-") if parts else "-",
        })
    return rows
