"""The image-position experiment repeated on an H100 (tests/data/gpu-h100-vlm/2026-12-05-position/): real SGLang
0.5.17, a random-weight Qwen2.5-VL-7B, unique images before vs after a shared 1,024-token system prompt.

Replayed under today's rules: every trial is read by the one result reader and is VALID, and the article's
section 4.3 holds on this card too: with the image first, the shared prompt is never reused (hit rate under 1%
against 43%), the wait moves into the scheduler's queue, and throughput falls."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from servetune.result import TrialResult

DATA = Path(__file__).resolve().parent / "data" / "gpu-h100-vlm" / "2026-12-05-position"


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[str, TrialResult]:
    root = tmp_path_factory.mktemp("h100-position")
    with tarfile.open(DATA / "trials.tar.xz") as tar:
        tar.extractall(root, filter="data")
    return {p.stem: TrialResult.read(p) for p in sorted((root / "trials" / "on").glob("*.json"))}


def test_three_valid_trials_on_one_h100(trials) -> None:
    assert sorted(trials) == ["vlm-position-system-s1", "vlm-position-system-s2", "vlm-position-text-s1"]
    for t in trials.values():
        assert t.summary.valid and t.summary.requests_ok == t.summary.requests_measured == 640
        assert t.environment["gpu_model"] == "NVIDIA H100 80GB HBM3"


def test_the_image_before_the_system_prompt_breaks_the_prefix_cache_and_costs_throughput(trials) -> None:
    after, before = trials["vlm-position-text-s1"].summary, trials["vlm-position-system-s1"].summary
    assert after.prefix_hit_rate > 0.4 and before.prefix_hit_rate < 0.01
    assert before.request_throughput / after.request_throughput == pytest.approx(0.82, abs=0.01)
    queue = {k: t.summary.multimodal.ttft_breakdown_ms.queue for k, t in trials.items()}
    assert min(queue["vlm-position-system-s1"], queue["vlm-position-system-s2"]) > 5 * queue["vlm-position-text-s1"]
    repeat = trials["vlm-position-system-s2"].summary.request_throughput
    assert repeat == pytest.approx(before.request_throughput, rel=0.01)  # the two seeds agree
