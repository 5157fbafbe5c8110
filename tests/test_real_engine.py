"""A trial against vLLM on the CPU: a real engine we did not write (tests/vllm_cpu.py starts it).

What only a real engine can tell us: that the lengths we ask for are the lengths it serves,
that its usage reports cached prefix tokens when a prefix repeats, and that its /metrics parse.
Kept small because the CPU engine is slow: 4 warm-up + 24 measured requests at concurrency 4.
"""

from __future__ import annotations

import pytest

from servetune.loadgen import LoadConfig, Target
from servetune.sla import SLA
from servetune.trial import TrialRequest, run_trial
from servetune.workload.spec import Fixed, SharedPrefix, Uniform, WorkloadSpec

pytestmark = pytest.mark.vllm

OUTPUT_TOKENS = 16
# vLLM caches whole KV blocks (128 tokens by default on the CPU backend), so the shared system
# prompt is longer than one block and every prompt is longer than the system prompt.
PREFIX_TOKENS = 136


@pytest.fixture(scope="module")
def trial(vllm_server):
    req = TrialRequest(
        target=Target(url=vllm_server.url, endpoint="completions", model=vllm_server.model, timeout_s=300),
        load=LoadConfig(concurrency=4, warmup_requests=4),
        workload=WorkloadSpec(
            name="real-engine",
            seed=7,
            input=Uniform(min=160, max=256),
            output=Fixed(value=OUTPUT_TOKENS),
            shared_prefix=SharedPrefix(tokens=PREFIX_TOKENS, share_ratio=1.0, num_prefixes=1),
        ),
        num_requests=24,
        sla=SLA(ttft_ms=60_000, tpot_ms=10_000),
        tokenizer=str(vllm_server.model_path),
        model_path=str(vllm_server.model_path),
        scrape_interval_s=0.5,
    )
    return run_trial(req)


def test_trial_succeeds(trial):
    assert trial.status == "ok", trial.failure_reason
    s = trial.summary
    assert (s.requests_measured, s.requests_ok, s.error_rate) == (24, 24, 0.0)
    assert s.lengths_exact is True


def test_usage_completion_tokens_equal_requested_output(trial):
    for r in trial.records:
        assert r.completion_tokens == r.requested_output_tokens == OUTPUT_TOKENS, r


def test_prompt_tokens_match_requested_lengths_with_the_models_tokenizer(trial):
    for r in trial.records:
        assert r.prompt_tokens is not None
        assert abs(r.prompt_tokens - r.requested_input_tokens) <= 0.02 * r.requested_input_tokens, (
            r.request_id,
            r.prompt_tokens,
            r.requested_input_tokens,
        )


def test_a_repeated_prefix_is_served_from_the_cache(trial):
    measured = [r for r in trial.records if not r.warmup]
    assert all(r.cached_tokens is not None for r in measured)
    assert sum(r.cached_tokens > 0 for r in measured) >= len(measured) - 4  # the warm-up filled the cache
    assert trial.summary.prefix_hit_rate is not None and 0 < trial.summary.prefix_hit_rate < 1


def test_ttft_precedes_e2e_and_itl_is_per_token(trial):
    for r in trial.records:
        assert r.ttft_ms is not None and r.e2e_ms is not None and r.ttft_ms < r.e2e_ms
    s = trial.summary
    # the latencies are those of the requests that completed in the steady window (one turnover of the
    # 4 streams .. the last dispatch): 28 requests give about 20
    n = s.completions_in_window
    assert 12 <= n < 28 and s.tpot_ms.count == s.ttft_ms.count == n
    assert s.itl_ms.count >= n * (OUTPUT_TOKENS - 1) * 0.5
    assert s.output_tokens_per_s > 0 and s.goodput_fraction == 1.0
    assert s.goodput_rps <= s.request_throughput and s.in_flight_mean == pytest.approx(4, rel=0.1)
    # 24 measured requests decide nothing by the default rules, and the result says why
    assert s.valid is False and any("completed in the window" in r for r in s.invalid_reasons)


def test_vllm_metrics_are_parsed(trial):
    s = trial.summary
    assert s.server_samples >= 1
    assert s.prefix_hit_rate_server is not None and 0 < s.prefix_hit_rate_server <= 1
    families = _family_names(trial.server)
    assert any(name.startswith("vllm:") for name in families), sorted(families)[:20]


def _family_names(server: dict) -> set[str]:
    """Names of the metric families in the scraper's snapshots (whatever nesting it uses)."""
    names: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if isinstance(k, str) and k.startswith(("vllm:", "sglang:")):
                    names.add(k)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(server)
    return names
