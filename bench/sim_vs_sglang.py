"""The simulator's prediction against real SGLang trials it was not fitted on.

Each kept real-SGLang trial (tests/data/gpu-h200-sglang: the repeat study and the campaign's
trials, SGLang 0.5.17 on an H200, a random 7.2B Llama) is replayed in virtual time with the same
workload spec and seed, request count, warm-up and concurrency, against a simulator profile
(``--gpu H200 --model llama-3.1-8b`` by default). Printed: per trial the measured and predicted
output tok/s, TPOT p50 and TTFT p50 with the relative error, then the median absolute error per
figure (the target for a calibrated profile: <= 10% on throughput and TPOT).

    .venv/bin/python bench/sim_vs_sglang.py [--gpu H200] [--model llama-3.1-8b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import orjson

from servetune.loadgen import LoadConfig
from servetune.plan import load_plan
from servetune.sim.virtual import simulate
from servetune.workload import build_requests

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu-h200-sglang"
FIGURES = (("output tok/s", lambda s: s["output_tokens_per_s"]), ("TPOT p50 ms", lambda s: s["tpot_ms"]["p50"]),
           ("TTFT p50 ms", lambda s: s["ttft_ms"]["p50"]))


def real_trials() -> list[dict]:
    """(level, requests, warmup, seed, summary) of every kept real trial with a steady window."""
    out = []
    study = orjson.loads((DATA / "study.json").read_bytes())
    for row in study["trials"]:
        out.append({"source": f"study {row['file']}", "level": row["level"], "requests": row["requests"],
                    "warmup": 16, "seed": row["seed"], "summary": row["summary"]})
    state = orjson.loads((DATA / "tune-a" / "state.json").read_bytes())
    for o in state["outcomes"]:
        if o["stage"] != "correctness":
            out.append({"source": f"tune {o['trial_id'][:8]}", "level": o["concurrency"], "requests": o["requests"],
                        "warmup": o["warmup"], "seed": None, "seed_offset": o.get("seed_offset", 0),
                        "summary": o["summary"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--model", default="llama-3.1-8b")
    args = ap.parse_args()
    plan = load_plan(REPO / "plans" / "gpu-h200-sglang.yaml")
    base = plan.workload.model_copy(update={"tokenizer": None})  # the simulator counts its own tokens
    sim_args = {"gpu-profile": args.gpu, "model-profile": args.model, "mem-fraction-static": 0.8,
                "enable-metrics": True, "enable-cache-report": True}
    errors: dict[str, list[float]] = {name: [] for name, _ in FIGURES}
    print("| trial | level | " + " | ".join(f"{n} real / sim (error)" for n, _ in FIGURES) + " |")
    print("|---|---|" + "---|" * len(FIGURES))
    for t in sorted(real_trials(), key=lambda t: (t["level"], t["source"])):
        seed = t["seed"] if t["seed"] is not None else base.seed + t.get("seed_offset", 0)
        work = base.model_copy(update={"seed": seed})
        reqs = build_requests(work, t["warmup"] + t["requests"]).requests
        res = simulate(sim_args, reqs, LoadConfig(concurrency=t["level"], warmup_requests=t["warmup"], seed=seed))
        sim = res.summary.model_dump()
        cells = []
        for name, get in FIGURES:
            real, pred = get(t["summary"]), get(sim)
            if real and pred:
                err = pred / real - 1
                errors[name].append(abs(err))
                cells.append(f"{real:.1f} / {pred:.1f} ({err:+.0%})")
            else:
                cells.append("-")
        print(f"| {t['source']} | {t['level']} | " + " | ".join(cells) + " |")
    print()
    for name, errs in errors.items():
        if errs:
            print(f"median |error| {name}: {statistics.median(errs):.1%} over {len(errs)} trials (max {max(errs):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
