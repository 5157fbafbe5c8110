"""How noisy is one trial? Repeats of the same closed-loop trial at a few levels, each with its own workload seed.

Starts the plan's engine once (servetune.runners.provision, the same path ``servetune tune`` uses),
then runs ``--repeats`` trials at each ``--levels`` with workload seeds seed, seed+1, ..., each
sized by servetune.tuning.sizing to pass the plan's validity rules. Prints, per level, the mean,
the CV and the 95% interval of goodput, output tokens/s, p99 TTFT and p99 TPOT (servetune.stats),
and how many repeats passed the plan's SLA. Writes each trial's summary (records dropped, so the
results stay small) and a study.json with the table.

    python bench/repeat_study.py plans/gpu-h200-sglang.yaml --levels 16,64,128 --repeats 5 --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

from servetune.plan import load_plan
from servetune.stats import spread
from servetune.tuning.live import LiveTrialRunner
from servetune.tuning.sizing import size_trial
from servetune.tuning.state import CampaignState, TrialOutcome, TrialSpec
from servetune.tuning.verdict import judge

FIGURES = (("goodput req/s", lambda s: s.goodput_rps), ("output tok/s", lambda s: s.output_tokens_per_s),
           ("p99 TTFT ms", lambda s: s.ttft_ms.p99), ("p99 TPOT ms", lambda s: s.tpot_ms.p99))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--levels", default="16,64,128")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    plan = load_plan(args.plan)
    levels = [int(x) for x in args.levels.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    runner = LiveTrialRunner(plan, log_dir=args.out / "logs")
    flags = plan.engine_flags()
    state = CampaignState()
    rows = []
    t_start = time.monotonic()
    try:
        for level in levels:
            outcomes: list[TrialOutcome] = []
            requests, warmup, how = size_trial(plan, state, flags, level, "ramp")
            k = attempts = 0
            while k < args.repeats and attempts < args.repeats + plan.repeats.invalid_retries:
                attempts += 1
                spec = TrialSpec(stage="ramp", concurrency=level, flags=flags, requests=requests, warmup=warmup,
                                 reason=f"repeat study: level {level}, repeat {k + 1}", seed_offset=k, sizing=how)
                rep = runner.run(spec, experiment_id="repeat-study")
                o = TrialOutcome.from_result(spec, rep.result, gpu_seconds=rep.gpu_seconds, restarted=rep.restarted)
                state = state.add(o)
                if k == 0 and not o.valid:  # the first size was a guess: re-size from what it measured, once
                    requests, warmup, how = size_trial(plan, state, flags, level, "ramp", resize_from=o)
                    print(f"# level {level}: INVALID at {spec.requests} requests"
                          f" ({'; '.join(o.summary.invalid_reasons)}); re-sized to {requests}",
                          file=sys.stderr, flush=True)
                    continue
                outcomes.append(o)
                result = rep.result
                result.records = []  # the summaries are the study; records would make it megabytes
                result.gpu = {k2: v for k2, v in result.gpu.items() if k2 != "samples"}
                result.server = {k2: v for k2, v in result.server.items() if k2 != "samples"}
                result.save(args.out / "trials" / f"c{level}-r{k}.json")  # k: this repeat's seed offset
                s = o.summary
                print(f"# level {level} repeat {k + 1}: {requests} requests, valid={s.valid} "
                      f"goodput {s.goodput_rps or 0:.2f} req/s, p99 TTFT {s.ttft_ms.p99 or 0:.0f} ms, "
                      f"p99 TPOT {s.tpot_ms.p99 or 0:.2f} ms, window {s.window_s or 0:.1f} s "
                      f"({time.monotonic() - t_start:.0f} s)", file=sys.stderr, flush=True)
                k += 1
            valid = [o for o in outcomes if o.valid]
            row = {"level": level, "requests": requests, "repeats": len(outcomes), "valid": len(valid),
                   "passed_sla": sum(judge(o, plan.sla).passed for o in valid)}
            for name, get in FIGURES:
                row[name] = spread([get(o.summary) for o in valid]).model_dump()
            rows.append(row)
    finally:
        runner.close()
    print("| level | valid / repeats | passed SLA | "
          + " | ".join(f"{n} (mean ± 95% CI, CV)" for n, _ in FIGURES) + " |")
    print("|---|---|---|" + "---|" * len(FIGURES))
    for row in rows:
        cells = []
        for name, _ in FIGURES:
            sp = row[name]
            cells.append("-" if sp["mean"] is None else
                         f"{sp['mean']:.2f} ± {sp['ci95'] or 0:.2f} (CV {100 * (sp['cv'] or 0):.1f}%)")
        print(f"| {row['level']} | {row['valid']} / {row['repeats']} | {row['passed_sla']} | "
              + " | ".join(cells) + " |")
    (args.out / "study.json").write_bytes(orjson.dumps({"plan": plan.name, "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
