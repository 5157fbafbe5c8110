"""Rate mode: the staged capacity search against an exhaustive rate grid, in the simulator's virtual time.

For each scenario (GPU x model x workload x SLA, shared with bench/tuning_efficiency.py) the plan runs
in rate mode (``load: {mode: rate}``, Poisson arrivals, refinement off: this measures the search for
the capacity, not the flag walk) through ``servetune.tuning`` (the code `servetune tune` runs), and an
exhaustive grid runs the same default config at every rate from the ladder's lowest to its highest
in steps of ``--step`` (5%, geometric), each trial sized by the tuner's own rule
(servetune.tuning.sizing, one size per ladder rung's band), re-run once on the same seed, bigger, when INVALID,
and once at the tuner's settled size when a p99 or latency-growth interval holds its bound (evidence.unsettled).
Both judge a trial with the same verdict (SLA p99s, errors, memory, and whether the server kept up:
servetune.tuning.verdict) and a rate with the same rule: it passes only when it passes on every one of
``--seeds`` workload and arrival seeds (the plan's ``repeats.count``, the same seeds on both sides), and a
capacity is the highest rate that passes with every lower rate passing too (docs/tuning.md, "Capacity"). The
grid's figure follows the same rule: its highest rate below its first failing one, where it then runs one more rate
(between the two, so its resolution at the edge is the search's 2.5%). A scenario with its own
arrivals (gamma shape 0.3) keeps them whatever ``--arrival`` says. The grid's own seed-to-seed spread
is printed: each seed's capacity alone (the highest rate that seed passes before its first failure)
as min-max, and so is its highest passing rate anywhere (a pass above a failing rate, the noise).

Printed per scenario: the capacity the search states (requests/s at the SLA), the grid's capacity,
their ratio (target: within 5% either way), the GPU time of each and their ratio (target <= 30%); at the
end, the median search GPU minutes per answer (one capacity per scenario) over the scenarios run.

``--clear-margin M`` sets ``repeats.clear_margin`` (adaptive repeats, docs/tuning.md) in the search's plan
only; the grid keeps the plan without it. ``--grid-cache DIR`` keeps each scenario's grid trials in DIR and
reuses them while the grid's plan, rates, seeds, the bench's grid code and servetune's sources are as they
were (virtual time: a grid re-run gives the same trials; bench/tuning_efficiency.py, ``cached_grid``).

    .venv/bin/python bench/capacity_search.py [--only NAME[,NAME]] [--step 0.05] [--arrival poisson|gamma] [--seeds 3]
        [--clear-margin 0.5] [--grid-cache DIR]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servetune.plan import TuningPlan, parse_plan  # noqa: E402
from servetune.tuning.campaign import dry_run  # noqa: E402
from servetune.tuning.evidence import level_size, pool, size_band  # noqa: E402
from servetune.tuning.runner import SimTrialRunner  # noqa: E402
from servetune.tuning.sizing import size_trial  # noqa: E402
from servetune.tuning.state import CampaignState, TrialOutcome  # noqa: E402
from servetune.tuning.verdict import judge  # noqa: E402
from tuning_efficiency import SCENARIOS, Scenario, cached_grid, cells, measure  # noqa: E402

LADDER = [0.5, 1, 2, 4, 8, 16, 32, 64]
PICKED = ("a100-8b-chat", "h100-8b-rag-long-prompt", "l40s-8b-chat", "a100-8b-agent-shared-prefix",
          "h100-8b-decode-heavy", "h200-8b-chat-tight-ttft", "h100-8b-sessions-5pct-24k", "a100-8b-fewshot-one-prefix",
          "l40s-8b-chat-bursty-gamma-0.3")


def make_plan(sc: Scenario, arrival: str, burstiness: float, seeds: int,
              clear_margin: float | None = None) -> TuningPlan:
    if sc.arrival is not None:
        arrival, burstiness = sc.arrival["arrival"], sc.arrival.get("burstiness", burstiness)
    return parse_plan({
        "name": sc.name, "model": sc.model,
        "engine": {"kind": "sim", "gpu_profile": sc.gpu, "model_profile": sc.model, "args": sc.flags},
        "workload": {"seed": 1, **sc.workload},
        "load": {"mode": "rate", "arrival": arrival, "max_in_flight": 1024,
                 **({"burstiness": burstiness} if arrival == "gamma" else {})},
        "sla": {**sc.sla, "max_error_rate": 0.01, "gpu_memory_limit": 0.98},
        "stages": {
            "correctness": {"enabled": False},
            "baseline": {"rate": LADDER[0] / 2, "requests": 200, "warmup": 16},
            "ramp": {"levels": LADDER, "requests": 200, "warmup": 16, "bisect": True},
            "refine": {"enabled": False},
        },
        "budget": {"max_gpu_minutes": 100000, "restart_cost_s": 60},
        "repeats": {"count": seeds, "max": max(5, seeds),
                    **({"clear_margin": clear_margin} if clear_margin is not None else {})},
    }, source=sc.name)


def grid_rates(lo: float, hi: float, step: float) -> list[float]:
    n = math.ceil(math.log(hi / lo) / math.log(1 + step))
    return [round(lo * (1 + step) ** k, 3) for k in range(n + 1)]


def run_grid(plan: TuningPlan, rates: list[float], seeds: int) -> list[TrialOutcome]:
    """One server, every rate in order on seeds 0..``seeds``-1, each trial sized like the tuner's: one size per
    ladder rung's band (evidence.size_band), set by the rung's own trials (an INVALID one re-run bigger on its
    seed), so a band's rung runs before its first rate, as in the tuner's walk. Stops four failing rates in a row
    past the last pass (a grid that knows no capacity must look above the first failure)."""
    runner = SimTrialRunner(plan)
    flags = plan.engine_flags()
    seen, out, fails = CampaignState(), [], 0

    def run_rate(rate: float, as_the_tuner: bool = False) -> list[TrialOutcome]:
        nonlocal seen
        for seed in range(seeds):
            o = measure(plan, runner, seen, flags, rate, seed, band_size(plan, seen, flags, rate), False)
            seen = seen.add(o)
            if as_the_tuner and not pool(plan, flags, rate, seen.measurements(flags, rate)).passed:
                break  # the tuner stops a rate at its first failing seed (and sizes the band from what ran)
        return seen.measurements(flags, rate)

    for rate in rates:
        rung = size_band(plan, rate)
        if rung != rate and not seen.measurements(flags, rung):
            out.extend(run_rate(rung, as_the_tuner=True))  # the band's size, as the tuner's ladder sets it
        here = run_rate(rate)
        out.extend(here)
        fails = 0 if pool(plan, flags, rate, here).passed else fails + 1
        if fails >= 4 and best_rate(plan, out) is not None:
            break
    edge = sustained_rate(plan, out), first_failure(plan, out)
    if edge[0] is not None and edge[1] is not None:  # the edge at the search's resolution: one rate between
        out.extend(run_rate(round(math.sqrt(edge[0] * edge[1]), 3)))
    return out


def band_size(plan: TuningPlan, seen: CampaignState, flags: dict, rate: float) -> tuple[int, int]:
    """The tuner's sizing (evidence.size_band): every rate of a ladder rung's band at one size, the band's first
    trial sized for the rung."""
    ref = level_size(plan, seen, rate)
    if ref is not None:
        return ref.requests, ref.warmup
    requests, warmup, _ = size_trial(plan, seen, flags, size_band(plan, rate), "ramp")
    return requests, warmup


def best_rate(plan: TuningPlan, outcomes: list[TrialOutcome]) -> float | None:
    """The highest rate that passes on every seed (the tuner's rule, evidence.pool), anywhere in the grid."""
    return max((e.level for e in cells(plan, outcomes).values() if e.passed), default=None)  # type: ignore[arg-type]


def _in_order(plan: TuningPlan, outcomes: list[TrialOutcome]) -> list[tuple[float, bool]]:
    return sorted((float(e.level), e.passed) for e in cells(plan, outcomes).values())


def sustained_rate(plan: TuningPlan, outcomes: list[TrialOutcome]) -> float | None:
    """The grid's capacity by the tuner's rule: the highest rate that passes on every seed with every lower
    rate passing too (a pass above a failing rate is not a rate the service sustains)."""
    last = None
    for rate, passed in _in_order(plan, outcomes):
        if not passed:
            break
        last = rate
    return last


def first_failure(plan: TuningPlan, outcomes: list[TrialOutcome]) -> float | None:
    return next((rate for rate, passed in _in_order(plan, outcomes) if not passed), None)


def seed_capacities(plan: TuningPlan, outcomes: list[TrialOutcome], seeds: int) -> list[float | None]:
    """Each seed alone: its highest passing rate below its first failing one (where that seed's grid would stop)."""
    out = []
    for seed in range(seeds):
        last: dict[float, TrialOutcome] = {}
        for o in outcomes:
            if o.seed_offset == seed and o.rate is not None:
                last[o.rate] = o  # the re-run when there was one
        passed = None
        for rate in sorted(last):
            if not judge(last[rate], plan.sla).passed:
                break
            passed = rate
        out.append(passed)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None,
                    help="run only scenarios whose name contains this (comma-separated: any of these)")
    ap.add_argument("--step", type=float, default=0.05, help="the grid's geometric step (default 5%%)")
    ap.add_argument("--arrival", choices=("poisson", "gamma"), default="poisson")
    ap.add_argument("--burstiness", type=float, default=0.5, help="gamma shape with --arrival gamma")
    ap.add_argument("--seeds", type=int, default=3, help="a rate must pass on each of these seeds (default 3)")
    ap.add_argument("--clear-margin", type=float, default=None, metavar="M",
                    help="repeats.clear_margin in the search's plan (adaptive repeats); default none")
    ap.add_argument("--grid-cache", default=None, metavar="DIR",
                    help="keep each scenario's grid trials here and reuse them while nothing they depend on changed")
    args = ap.parse_args()
    only = [x for x in (args.only or "").split(",") if x]
    header = ("scenario", "arrivals", "search trials", "grid trials", "capacity req/s", "grid capacity req/s",
              "ratio", "grid best pass anywhere", "grid per-seed capacities", "search GPU min", "grid GPU min",
              "GPU-time ratio", "ceiling kind", "meets target")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ok_all, worst, t_start, n = True, None, time.perf_counter(), 0
    minutes: list[float] = []
    for sc in SCENARIOS:
        if sc.name not in PICKED or (only and not any(x in sc.name for x in only)):
            continue
        plan = make_plan(sc, args.arrival, args.burstiness, args.seeds)  # the grid's
        search = make_plan(sc, args.arrival, args.burstiness, args.seeds, args.clear_margin)  # the search's
        t0 = time.perf_counter()
        decision, staged, _ = dry_run(search, SimTrialRunner(search), checklist=False)
        t1 = time.perf_counter()
        cap = decision.recommendation.rate if decision.recommendation else None
        rates = grid_rates(plan.baseline_level, LADDER[-1], args.step)
        grid, was_cached = cached_grid(args.grid_cache, plan, [run_grid, band_size, grid_rates],
                                       f"capacity_search rates={rates} seeds={args.seeds}",
                                       lambda p=plan, r=rates: run_grid(p, r, args.seeds))
        best, anywhere = sustained_rate(plan, grid), best_rate(plan, grid)
        per_seed = [c for c in seed_capacities(plan, grid, args.seeds) if c is not None]
        spread_text = f"{min(per_seed):g}-{max(per_seed):g}" if per_seed else "-"
        t_s, t_g = sum(o.gpu_seconds for o in staged), sum(o.gpu_seconds for o in grid)
        ratio = cap / best if cap and best else float("nan")
        ok = abs(ratio - 1) <= 0.05 and t_s / t_g <= 0.30
        ok_all &= ok
        n += 1
        minutes.append(t_s / 60)
        if worst is None or not abs(ratio - 1) <= abs(worst[0] - 1):
            worst = (ratio, sc.name)
        kind = decision.ceiling.kind if decision.ceiling else "-"
        assert plan.load is not None
        print(f"| {sc.name} | {plan.load.arrivals_text()} | {len(staged)} | {len(grid)} | {cap} | {best} |"
              f" {ratio:.1%} | {anywhere} | {spread_text} | {t_s / 60:.1f} | {t_g / 60:.1f} | {t_s / t_g:.1%} |"
              f" {kind} | {'yes' if ok else 'NO'} |",
              flush=True)
        print(f"# {sc.name}: search {t1 - t0:.0f} s, grid{' (cached)' if was_cached else ''}"
              f" {time.perf_counter() - t1:.0f} s wall", file=sys.stderr, flush=True)
    margin = "none" if args.clear_margin is None else f"{args.clear_margin:g}"
    print(f"\n{n} scenarios ({args.arrival}, {args.seeds} seeds, clear margin {margin}),"
          f" {time.perf_counter() - t_start:.0f} s wall; all within"
          f" 5% of the grid at <= 30% of its GPU time: {'yes' if ok_all else 'NO'}"
          + (f"; worst ratio {worst[0]:.1%} ({worst[1]})" if worst else ""))
    if minutes:
        print(f"median search GPU min per answer: {statistics.median(minutes):.1f}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
