"""Rule 4: static (wave) against continuous batching, at equal B, on one server.

A ``waves`` trial (``servetune bench --waves B``) sends B requests, waits for all of them, then the next
B: the batch is as full as it gets only at each wave's start and drains to its longest request, which is
what static batching does. A closed-loop trial at concurrency B on the same server configuration and
workload is continuous batching at the same B. The finding states both throughputs and latencies.
"""

from __future__ import annotations

from collections.abc import Iterable

from servetune.diagnose import Finding, r3
from servetune.result import TrialResult

GAIN_NOTABLE = 1.2  # continuous / waves throughput at or above: continuous batching wins clearly


def _key(t: TrialResult) -> tuple[str, str, int]:
    cfg = sorted((str(k).lstrip("-").replace("-", "_"), str(v)) for k, v in (t.server_config or {}).items())
    return (repr(cfg), str((t.workload or {}).get("fingerprint")), int(t.load.get("concurrency") or 0))


def compare(trials: Iterable[TrialResult]) -> list[Finding]:
    """One finding per waves trial with a closed-loop trial of the same B, server config and workload."""
    trials = [t for t in trials if t.status == "ok"]
    continuous = {_key(t): t for t in trials if (t.load.get("mode") or "concurrency") == "concurrency"}
    out = []
    for w in (t for t in trials if t.load.get("mode") == "waves"):
        c = continuous.get(_key(w))
        if c is None:
            continue
        sw, sc = w.summary, c.summary
        gain = (sc.request_throughput / sw.request_throughput
                if sc.request_throughput and sw.request_throughput else None)
        ev = {"batch": int(w.load.get("concurrency") or 0), "continuous_trial": c.trial_id,
              "waves_rps": r3(sw.request_throughput), "continuous_rps": r3(sc.request_throughput),
              "waves_output_tps": r3(sw.output_tokens_per_s), "continuous_output_tps": r3(sc.output_tokens_per_s),
              "waves_ttft_p50_ms": r3(sw.ttft_ms.p50), "continuous_ttft_p50_ms": r3(sc.ttft_ms.p50),
              "waves_e2e_p50_ms": r3(sw.e2e_ms.p50), "continuous_e2e_p50_ms": r3(sc.e2e_ms.p50),
              "waves_e2e_p99_ms": r3(sw.e2e_ms.p99), "continuous_e2e_p99_ms": r3(sc.e2e_ms.p99),
              "continuous_over_waves": r3(gain)}
        text = "-" if gain is None else f"x{gain:.2f}"
        out.append(Finding(
            trial_id=w.trial_id, kind="batching.waves_vs_continuous",
            severity="warning" if gain is not None and gain < 1.0 else "info", evidence=ev,
            summary=f"at B={ev['batch']}: continuous batching {_f(sc.request_throughput)} req/s against waves"
                    f" {_f(sw.request_throughput)} ({text}); E2E p50 {_f(sc.e2e_ms.p50, 0)}"
                    f" against {_f(sw.e2e_ms.p50, 0)} ms",
            advice=None if gain is None or gain >= 1.0 else
            "waves beat continuous batching here: check the continuous trial's queue and retractions"))
    return out


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
