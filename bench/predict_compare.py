"""The calibrated simulator in the loop (``refine.predict``): the staged campaign of bench scenarios with and
without it, in virtual time, as bench/tuning_efficiency.py builds them; prints trials, GPU minutes, the answer
each way and the candidates it did not measure. The grid is not run: the same answer both ways means the same
goodput against the grid's best (bench/tuning_efficiency.py has it).

    .venv/bin/python bench/predict_compare.py a100-8b-chat h200-70b-tp4-chat
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servetune.tuning.campaign import dry_run  # noqa: E402
from servetune.tuning.runner import SimTrialRunner  # noqa: E402
from tuning_efficiency import SCENARIOS, make_plan  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+", help="scenario names (bench/tuning_efficiency.py SCENARIOS)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    known = {s.name: s for s in SCENARIOS}
    print("| scenario | trials without | GPU min without | trials with | GPU min with | ratio | same answer |")
    print("|---|---|---|---|---|---|---|")
    same_all = True
    for name in args.scenarios:
        sc = known[name]
        runs = []
        for predict in (False, True):
            plan = make_plan(sc, args.requests, args.seeds, None, predict)
            t = time.perf_counter()
            decision, outcomes, _ = dry_run(plan, SimTrialRunner(plan), checklist=False)
            rec = decision.recommendation
            runs.append((len(outcomes), sum(o.gpu_seconds for o in outcomes) / 60,
                         (rec.config, rec.concurrency) if rec else None, rec, time.perf_counter() - t))
        (n0, g0, a0, _, _), (n1, g1, a1, rec, _) = runs
        same = a0 == a1
        same_all &= same
        print(f"| {name} | {n0} | {g0:.1f} | {n1} | {g1:.1f} | {g1 / g0:.2f} |"
              f" {'yes' if same else f'NO: {a0} vs {a1}'} |", flush=True)
        for line in rec.explanation if rec else []:
            if "not measured" in line or line.startswith("prediction"):
                print(f"    {line}", file=sys.stderr)
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
