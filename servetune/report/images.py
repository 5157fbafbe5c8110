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
        ttft, parts = mm.get("ttft_p50_ms") or {}, mm.get("ttft_breakdown_ms") or {}
        pay = mm.get("payload_bytes_p50") or {}
        rows.append({
            "trial_id": t.trial_id, "stage": t.stage or "bench",
            "level": "-" if level_of(t) is None else f"{level_of(t):g}",
            "image_requests": f"{mm['image_requests']} / {mm['image_requests'] + mm['text_requests']}",
            "tokens_per_image": _f(mm.get("image_tokens_per_image_p50")),
            "share": _f(mm.get("image_token_share"), "{:.0%}"),
            "hit": f"{_f(mm.get('hit_rate_image_tokens'), '{:.0%}')} / {_f(mm.get('hit_rate_text_tokens'), '{:.0%}')}",
            "ttft": " / ".join(_f(ttft.get(k)) for k in ("text", "image_hit", "image_miss")),
            "payload": f"{_f((pay.get('image') or 0) / 1024 if pay.get('image') else None)} /"
                       f" {_f((pay.get('text') or 0) / 1024 if pay.get('text') else None, '{:.1f}')}",
            "breakdown": " / ".join(_f(parts.get(k)) for k in ("queue", "in_server_after_queue", "outside_server")),
            "dominant": WHERE.get(parts.get("dominant") or "", "-"),
        })
    return rows
