"""A trial as the pandas frames the Great Expectations suites run on.

Three frames: ``summary`` (one row: the warehouse's summary columns plus a few derived checks the
suites cannot express alone, such as "does the GPU curve cover the window"), ``requests`` (measured,
non-warm-up requests) and ``gpu`` (memory samples with the gap to the previous sample of the same GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from servetune.energy import UNAVAILABLE
from servetune.gpu_summary import clean_at_start
from servetune.result import TrialResult
from servetune.warehouse.tables import flatten_summary

REQUEST_COLUMNS = (
    "request_id", "t_send_s", "queue_ms", "ttft_ms", "e2e_ms", "tpot_ms", "prompt_tokens",
    "completion_tokens", "cached_tokens", "requested_input_tokens", "requested_output_tokens",
    "n_images", "turn", "error_class",
)
IMAGE_COLUMNS = ("image_token_share", "hit_rate_image_tokens", "hit_rate_text_tokens", "image_tokens_per_image_p50")
GPU_COLUMNS = ("t_s", "gpu", "mem_used", "mem_total", "util", "power_w", "energy_mj", "gap_ms", "energy_step_j",
               "power_headroom_w")
POWER_LIMIT_SLACK = 1.1  # NVML's power reading may pass the enforced limit briefly (its averaging, boost)


@dataclass
class TrialFrames:
    summary: pd.DataFrame
    requests: pd.DataFrame
    gpu: pd.DataFrame


def request_frame(result: TrialResult) -> pd.DataFrame:
    rows = [
        (r.request_id, r.t_send_s, r.queue_ms, r.ttft_ms, r.e2e_ms, r.tpot_ms(), r.prompt_tokens,
         r.completion_tokens, r.cached_tokens, r.requested_input_tokens, r.requested_output_tokens,
         r.n_images, r.turn, r.error_class)
        for r in result.records
        if not r.warmup
    ]
    df = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    for col in ("t_send_s", "queue_ms", "ttft_ms", "e2e_ms", "tpot_ms"):
        df[col] = df[col].astype("float64")
    for col in ("prompt_tokens", "completion_tokens", "cached_tokens", "requested_input_tokens",
                "requested_output_tokens"):
        df[col] = df[col].astype("Float64")  # nullable: keeps None as missing, not NaN-vs-None mix
    return df


def gpu_frame(result: TrialResult) -> pd.DataFrame:
    """One row per sample; ``energy_step_j`` (the counter's step, never negative) and ``power_headroom_w``
    (the board's limit with slack, minus the reading) are the energy item's evidence."""
    samples = result.gpu.get("samples") or []
    df = pd.DataFrame.from_records(
        [(s.get("t_s"), s.get("gpu", 0), s.get("mem_used"), s.get("mem_total"), s.get("util"),
          s.get("power_w"), s.get("energy_mj")) for s in samples],
        columns=list(GPU_COLUMNS[:7]),
    )
    for col in ("t_s", "mem_used", "mem_total", "util", "power_w", "energy_mj"):
        df[col] = df[col].astype("float64")
    df = df.sort_values(["gpu", "t_s"], kind="stable").reset_index(drop=True)
    by_gpu = df.groupby("gpu")
    df["gap_ms"] = by_gpu["t_s"].diff() * 1000.0
    df["energy_step_j"] = by_gpu["energy_mj"].diff() / 1000.0
    limits = {d.get("index"): d.get("power_limit_w") for d in result.gpu.get("devices") or []}
    limit = df["gpu"].map(lambda g: limits.get(g)).astype("float64")
    df["power_headroom_w"] = limit * POWER_LIMIT_SLACK - df["power_w"]
    return df


def _median_ratio(num: pd.Series, den: pd.Series) -> float | None:
    ok = num.notna() & den.notna() & (den > 0)
    if not ok.any():
        return None
    return float(np.median(num[ok].astype("float64") / den[ok].astype("float64")))


def _window_uncovered_s(result: TrialResult, gpu: pd.DataFrame) -> float | None:
    """Seconds of the window with no GPU sample at either end (None: no samples or no window)."""
    s = result.summary
    if gpu.empty or s.window_start_s is None or s.window_end_s is None:
        return None
    first, last = float(gpu["t_s"].min()), float(gpu["t_s"].max())
    return max(0.0, first - s.window_start_s) + max(0.0, s.window_end_s - last)


def _clean_at_start(result: TrialResult) -> bool | None:
    """The verdict the trial was measured with, else the one rule on its GPU record (older results)."""
    if result.summary.gpu_clean_at_start is not None:
        return result.summary.gpu_clean_at_start
    return clean_at_start(result.gpu)


def build_frames(result: TrialResult) -> TrialFrames:
    requests = request_frame(result)
    gpu = gpu_frame(result)
    row: dict[str, Any] = flatten_summary(result.summary)
    row = {k: v for k, v in row.items() if not isinstance(v, dict)}
    plain = requests[(requests["error_class"].isna()) & (requests["turn"] == 0) & (requests["n_images"] == 0)]
    row["input_len_vs_spec"] = _median_ratio(plain["prompt_tokens"], plain["requested_input_tokens"])
    row["text_only_requests"] = len(plain)  # 0 on an all-image trial: its length check does not apply
    ok = requests[requests["error_class"].isna()]
    row["output_len_vs_spec"] = _median_ratio(ok["completion_tokens"], ok["requested_output_tokens"])
    row["gpu_state"] = result.gpu.get("state") or result.summary.gpu_state
    row["gpu_clean_at_start"] = _clean_at_start(result)
    row["gpu_window_uncovered_s"] = _window_uncovered_s(result, gpu)
    method = result.summary.energy_method  # None: no GPU, no window, or a summary older than energy
    row["energy_on_gpu"] = None if method is None else method != UNAVAILABLE
    mm = result.summary.multimodal  # a trial with images (servetune.multimodal); None on text
    for key in IMAGE_COLUMNS:
        row[key] = getattr(mm, key) if mm else None
    summary = pd.DataFrame([row])
    summary["gpu_clean_at_start"] = summary["gpu_clean_at_start"].astype("object")
    summary["energy_on_gpu"] = summary["energy_on_gpu"].astype("object")
    summary[list(IMAGE_COLUMNS)] = summary[list(IMAGE_COLUMNS)].astype("float64")  # None -> NaN: skipped
    return TrialFrames(summary=summary, requests=requests, gpu=gpu)
