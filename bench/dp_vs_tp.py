"""Data parallel vs tensor parallel on two H200s, as the simulator predicts it (a model, not a measurement).

The workload, SLA and load of plans/gpu-h200-sglang-rate.yaml (the 7.2B random Llama's shared-prefix
chat, Poisson arrivals, p99 TTFT 1.5 s and p99 TPOT 25 ms), with the simulator's H200-sglang profile
(fitted on the real SGLang 0.5.17 campaigns, docs/sim.md) and model llama-8b-v32k. For each setup the
staged capacity search (servetune.tuning, rate mode, refinement off) runs in virtual time:
- TP1: one GPU, the measured setup (its real capacity: 28.5 req/s, docs/gpu.md);
- TP2: ``--tp-size 2`` on two GPUs: half the weights and KV per rank, two all-reduces per layer over
  NVLink (the profile's link bandwidth and all-reduce latency);
- DP2: ``--dp-size 2``: two independent TP1 replicas behind SGLang's round-robin controller. The
  simulator has no DP controller, so DP2 is modelled as two TP1 servers each fed half of the Poisson
  arrivals: its capacity is twice TP1's, and its latencies at a rate R are TP1's at R/2.
Printed: capacity at the SLA, the p50/p99 TTFT and TPOT at it, and the peak memory per GPU.

    .venv/bin/python bench/dp_vs_tp.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servetune.plan import load_plan  # noqa: E402
from servetune.tuning.campaign import Campaign  # noqa: E402
from servetune.tuning.runner import SimTrialRunner  # noqa: E402

GPU, MODEL = "H200-sglang", "llama-8b-v32k"


def capacity(tp: int) -> tuple[float, object]:
    plan = load_plan(ROOT / "plans" / "gpu-h200-sglang-rate.yaml")
    args = {**plan.engine.args, **({"tp-size": tp} if tp > 1 else {})}
    plan = plan.model_copy(update={
        "engine": plan.engine.model_copy(update={"args": args}),
        "runner": plan.runner.model_copy(update={"gpus": list(range(tp))}),
        "stages": plan.stages.model_copy(update={  # the ladder reaches past what two GPUs could serve
            "refine": plan.stages.refine.model_copy(update={"enabled": False}),
            "ramp": plan.stages.ramp.model_copy(update={"levels": [12, 24, 36, 48, 72, 96, 144]})}),
        "robustness": None,
        "budget": plan.budget.model_copy(update={"max_gpu_minutes": 10_000}),
    })
    with tempfile.TemporaryDirectory() as out:
        campaign = Campaign(plan, SimTrialRunner(plan, gpu=GPU, model=MODEL), out)
        d = campaign.run()
        rec = d.recommendation
        best = next(o for o in campaign.state.outcomes if o.trial_id == d.ceiling.pass_trial_id)
    assert d.ceiling.kind != "exhausted", "the ladder ended below the capacity"
    return (rec.rate if rec else 0.0), best


def main() -> None:
    rows = []
    for name, tp in (("TP1 (1 GPU)", 1), ("TP2 (--tp-size 2)", 2)):
        cap, best = capacity(tp)
        s = best.summary
        rows.append((name, tp, cap, s, s.gpu_mem_peak_fraction))
    tp1 = rows[0]
    rows.append(("DP2 (--dp-size 2, modelled as 2 x TP1)", 2, 2 * tp1[2], tp1[3], tp1[4]))
    print(f"# the simulator's prediction ({GPU}, {MODEL}), not a measurement; workload and SLA of"
          " plans/gpu-h200-sglang-rate.yaml")
    print("| setup | GPUs | capacity at the SLA req/s | per GPU req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |"
          " peak memory per GPU |")
    print("|---|---|---|---|---|---|---|")
    for name, gpus, cap, s, mem in rows:
        print(f"| {name} | {gpus} | {cap:g} | {cap / gpus:.1f} | {s.ttft_ms.p50:.0f} / {s.ttft_ms.p99:.0f} |"
              f" {s.tpot_ms.p50:.1f} / {s.tpot_ms.p99:.1f} | {mem:.0%} |")


if __name__ == "__main__":
    main()
