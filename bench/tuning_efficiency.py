"""Staged tuning vs the exhaustive grid, in the simulator's virtual time, accepted trials only.

For each scenario (GPU x model x workload) the staged campaign (servetune.tuning, the same code
`servetune tune` runs) and the exhaustive grid (every refinement flag combination x every ramp
level, max-running unset or = the level, as vLLM's auto_tune or SGLang's tune_server_args would)
run against ``servetune.sim.simulate``; the grid ramps each config until its first failing level.
Both see the same deterministic simulator and the same validity rules (servetune.validity, the
GPU defaults: a 20 s steady window, max(200, 4 x streams) completions), and both size their
trials with servetune.tuning.sizing (the grid re-runs an INVALID trial once, bigger, and an unsettled p99 or
latency-growth verdict once at the settled size, as the tuner does); a trial that stays INVALID counts for neither
side. Both are judged on the same workload seeds
(``--seeds``, default 3: the grid runs every config and level on each, a level passing by majority, and
one whose seeds disagree gets seeds up to ``repeats.max``, as the tuner's; the staged campaign runs with
``repeats.count`` = that many, as on a live engine, and its answer's config and level are measured on the
same seeds), so the ratio is not one seed's draw; the grid's own seed-to-seed spread (CV of its best
cell) is printed beside it.

GPU time = the sum of the simulated trial durations + a restart cost for every server start.
Printed per scenario: the best goodput of each (requests/s meeting the plan's SLA at a level whose
p99s, errors and memory pass, in a VALID trial), staged/grid goodput (target >= 97%), staged/grid
GPU time (target <= 30%), and trial counts; at the end, the median staged GPU minutes per answer (one
answer per scenario) over the scenarios run.

``--clear-margin M`` sets ``repeats.clear_margin`` (adaptive repeats: a verdict far from the SLA's edge is
settled on one seed; docs/tuning.md) and ``--predict`` sets ``refine.predict`` (the calibrated simulator in the
loop: servetune.tuning.predict) in the staged campaign's plan only: the grid, and the staged answer's
judging on the grid's seeds, keep the plan without it. ``--grid-cache DIR`` keeps each scenario's grid
trials in DIR and reuses them when nothing the grid depends on changed (the grid's plan, seeds, the bench's
grid code and servetune's sources): the simulator runs in virtual time, so a grid re-run gives the same
trials, and a run with and one without a margin need the grid once.

    .venv/bin/python bench/tuning_efficiency.py [--requests 200] [--seeds 3] [--only NAME] [--skip NAME]
        [--checklist] [--jobs 2] [--clear-margin 0.5] [--grid-cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import itertools
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servetune.plan import Level, TuningPlan, parse_plan
from servetune.tuning.campaign import dry_run
from servetune.tuning.ceiling import judge, ramp_levels
from servetune.tuning.evidence import Evidence, current, pool, unsettled
from servetune.tuning.runner import SimTrialRunner
from servetune.tuning.sizing import size_trial
from servetune.tuning.state import CampaignState, TrialOutcome, TrialSpec
from servetune.validation.campaign import check_trial

LEVELS = [16, 32, 48, 64, 96, 128, 192, 256]
GRID = {"chunked-prefill-size": [1024, 2048, 4096, 8192], "schedule-conservativeness": [0.3, 0.7, 1.0, 1.3]}
RESTART_S = 60.0

CHAT = {"input": {"kind": "lognormal", "median": 1024, "sigma": 0.6, "min": 64, "max": 4096},
        "output": {"kind": "lognormal", "median": 192, "sigma": 0.5, "min": 16, "max": 1024}}
# 90% chat-sized prompts, 10% long 16k documents
LONG_TAIL = {"kind": "mixture", "parts": [
    {"weight": 0.9, "dist": {"kind": "lognormal", "median": 1024, "sigma": 0.6, "min": 64, "max": 4096}},
    {"weight": 0.1, "dist": {"kind": "fixed", "value": 16000}}]}


@dataclass
class Scenario:
    name: str
    gpu: str
    model: str
    workload: dict[str, Any]
    sla: dict[str, float]
    flags: dict[str, Any]
    arrival: dict[str, Any] | None = None  # rate mode (bench/capacity_search.py): this scenario's own arrivals


SCENARIOS = [
    Scenario("a100-8b-chat", "A100-80G", "llama-3.1-8b", {"name": "chat", **CHAT},
             {"p99_ttft_ms": 2000, "p99_tpot_ms": 60}, {}),
    Scenario("h100-8b-rag-long-prompt", "H100-80G", "llama-3.1-8b",
             {"name": "rag", "input": {"kind": "lognormal", "median": 3000, "sigma": 0.3, "min": 1024, "max": 6000},
              "output": {"kind": "lognormal", "median": 128, "sigma": 0.4, "min": 16, "max": 512}},
             {"p99_ttft_ms": 3000, "p99_tpot_ms": 50}, {}),
    Scenario("l40s-8b-chat", "L40S", "llama-3.1-8b", {"name": "chat", **CHAT},
             {"p99_ttft_ms": 3000, "p99_tpot_ms": 80}, {}),
    Scenario("h200-70b-tp4-chat", "H200", "llama-3.1-70b", {"name": "chat", **CHAT},
             {"p99_ttft_ms": 3000, "p99_tpot_ms": 80}, {}),
    Scenario("a100-8b-agent-shared-prefix", "A100-80G", "llama-3.1-8b",
             {"name": "agent", "input": {"kind": "lognormal", "median": 2048, "sigma": 0.4, "min": 256, "max": 6000},
              "output": {"kind": "lognormal", "median": 160, "sigma": 0.5, "min": 16, "max": 768},
              "shared_prefix": {"tokens": 1536, "share_ratio": 0.9, "num_prefixes": 4}},
             {"p99_ttft_ms": 2000, "p99_tpot_ms": 60}, {}),
    Scenario("a100-vlm-8b-shared-prefix-images", "A100-80G", "llava-8b",
             {"name": "vlm", "input": {"kind": "lognormal", "median": 512, "sigma": 0.5, "min": 64, "max": 2048},
              "output": {"kind": "lognormal", "median": 160, "sigma": 0.4, "min": 16, "max": 512},
              "shared_prefix": {"tokens": 768, "share_ratio": 0.9, "num_prefixes": 2},
              "images": {"count": 1, "width": 672, "height": 672, "ratio": 0.6, "distinct": 32}},
             {"p99_ttft_ms": 3000, "p99_tpot_ms": 70}, {}),
    Scenario("h100-vlm-8b-shared-prefix-images", "H100-80G", "llava-8b",
             {"name": "vlm", "input": {"kind": "lognormal", "median": 768, "sigma": 0.5, "min": 64, "max": 3000},
              "output": {"kind": "lognormal", "median": 128, "sigma": 0.4, "min": 16, "max": 512},
              "shared_prefix": {"tokens": 1024, "share_ratio": 0.8, "num_prefixes": 3},
              "images": {"count": 2, "width": 512, "height": 512, "ratio": 0.5, "distinct": 64}},
             {"p99_ttft_ms": 2500, "p99_tpot_ms": 60}, {}),
    # new with the validity rules
    Scenario("a100-8b-multiturn-chat-10pct-16k", "A100-80G", "llama-3.1-8b",
             {"name": "multiturn-long", "input": LONG_TAIL,
              "output": {"kind": "lognormal", "median": 160, "sigma": 0.5, "min": 16, "max": 768},
              "shared_prefix": {"tokens": 512, "share_ratio": 1.0, "num_prefixes": 2},
              "multi_turn": {"turns": 3, "turn_input": {"kind": "uniform", "min": 32, "max": 256}}},
             {"p99_ttft_ms": 4000, "p99_tpot_ms": 80}, {}),
    Scenario("h100-8b-decode-heavy", "H100-80G", "llama-3.1-8b",
             {"name": "decode-heavy",
              "input": {"kind": "lognormal", "median": 256, "sigma": 0.5, "min": 32, "max": 1024},
              "output": {"kind": "lognormal", "median": 512, "sigma": 0.4, "min": 64, "max": 2048}},
             {"p99_ttft_ms": 1500, "p99_tpot_ms": 40}, {}),
    Scenario("l40s-8b-rag-shared-prefix", "L40S", "llama-3.1-8b",
             {"name": "rag-prefix",
              "input": {"kind": "lognormal", "median": 2500, "sigma": 0.3, "min": 1024, "max": 6000},
              "output": {"kind": "lognormal", "median": 128, "sigma": 0.4, "min": 16, "max": 512},
              "shared_prefix": {"tokens": 2048, "share_ratio": 0.95, "num_prefixes": 6}},
             {"p99_ttft_ms": 4000, "p99_tpot_ms": 80}, {}),
    Scenario("h200-8b-chat-tight-ttft", "H200", "llama-3.1-8b", {"name": "chat", **CHAT},
             {"p99_ttft_ms": 500, "p99_tpot_ms": 30}, {}),
    # new with paired decisions (2026-12-03): users in sessions whose prompts have a tail of very long ones
    Scenario("h100-8b-sessions-5pct-24k", "H100-80G", "llama-3.1-8b",
             {"name": "sessions-long-tail", "input": {"kind": "mixture", "parts": [
                 {"weight": 0.95, "dist": {"kind": "lognormal", "median": 768, "sigma": 0.6, "min": 64, "max": 4096}},
                 {"weight": 0.05, "dist": {"kind": "uniform", "min": 16000, "max": 24000}}]},
              "output": {"kind": "lognormal", "median": 192, "sigma": 0.5, "min": 16, "max": 768},
              "shared_prefix": {"tokens": 384, "share_ratio": 1.0, "num_prefixes": 1},
              "multi_turn": {"turns": 4, "turn_input": {"kind": "uniform", "min": 32, "max": 384}}},
             {"p99_ttft_ms": 5000, "p99_tpot_ms": 70}, {}),
    # few-shot: nearly the whole prompt is one shared prefix (3k of ~3.2k tokens)
    Scenario("a100-8b-fewshot-one-prefix", "A100-80G", "llama-3.1-8b",
             {"name": "fewshot", "input": {"kind": "lognormal", "median": 3200, "sigma": 0.05, "min": 3072,
                                           "max": 3600},
              "output": {"kind": "lognormal", "median": 96, "sigma": 0.5, "min": 8, "max": 384},
              "shared_prefix": {"tokens": 3000, "share_ratio": 1.0, "num_prefixes": 1}},
             {"p99_ttft_ms": 1500, "p99_tpot_ms": 50}, {}),
    # bursty arrivals (gamma shape 0.3) in bench/capacity_search.py; a chat load in the closed loop here
    Scenario("l40s-8b-chat-bursty-gamma-0.3", "L40S", "llama-3.1-8b", {"name": "chat", **CHAT},
             {"p99_ttft_ms": 3000, "p99_tpot_ms": 80}, {}, arrival={"arrival": "gamma", "burstiness": 0.3}),
]


def make_plan(sc: Scenario, requests: int, seeds: int, clear_margin: float | None = None,
              predict: bool = False) -> TuningPlan:
    prefix_policies = ["lpm"] if "shared_prefix" in sc.workload else []
    return parse_plan({
        "name": sc.name, "model": sc.model,
        "engine": {"kind": "sim", "gpu_profile": sc.gpu, "model_profile": sc.model, "args": sc.flags},
        "workload": {"seed": 1, **sc.workload},
        "sla": {**sc.sla, "max_error_rate": 0.01, "gpu_memory_limit": 0.98},
        "stages": {
            "correctness": {"enabled": False},
            "baseline": {"concurrency": 8, "requests": requests, "warmup": 16},
            "ramp": {"levels": LEVELS, "requests": requests, "warmup": 16, "bisect": True, "bisect_min_step": 8},
            "refine": {"grid": GRID, "shared_prefix_policies": prefix_policies, "extend_levels": 2,
                       **({"predict": {}} if predict else {})},
        },
        "budget": {"max_gpu_minutes": 100000, "restart_cost_s": RESTART_S},
        # as on a live engine: decisions on the seeds the grid is judged on (count), more inside the noise
        "repeats": {"count": seeds, "max": max(5, seeds),
                    **({"clear_margin": clear_margin} if clear_margin is not None else {})},
    }, source=sc.name)


def _sources_digest() -> str:
    """servetune's sources: a grid cached under another version of them is not reused."""
    root = Path(__file__).resolve().parent.parent / "servetune"
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cached_grid(cache: str | None, plan: TuningPlan, code: list[Callable[..., Any]], extra: str,
                run: Callable[[], list[TrialOutcome]]) -> tuple[list[TrialOutcome], bool]:
    """``run()`` (a grid), or its trials from ``cache`` when the grid's plan, ``extra`` (its other arguments), the
    bench functions in ``code`` and servetune's sources are all as they were; (trials, whether cached)."""
    if not cache:
        return run(), False
    h = hashlib.sha256()
    for part in (plan.model_dump_json(), extra, *(inspect.getsource(f) for f in code), _sources_digest()):
        h.update(part.encode())
        h.update(b"\0")
    path = Path(cache) / f"{plan.name}-{h.hexdigest()[:16]}.pickle"
    if path.exists():
        return pickle.loads(path.read_bytes()), True
    out = run()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(out))
    tmp.replace(path)
    return out, False


def grid_configs(plan: TuningPlan) -> list[dict[str, Any]]:
    """Every combination the staged search could pick from (max-running handled per level)."""
    base = plan.engine_flags()
    policies = [None, *plan.stages.refine.shared_prefix_policies]
    keys = list(plan.stages.refine.grid)
    out = []
    for policy in policies:
        for values in itertools.product(*plan.stages.refine.grid.values()):
            flags = {**base, **dict(zip(keys, values, strict=True))}
            if policy:
                flags["schedule-policy"] = policy
            out.append(flags)
    return out


def run_grid(plan: TuningPlan, seeds: int, checklist: bool = False) -> list[TrialOutcome]:
    """Config-major: start each server once and ramp it until its first failing level (max-running = level
    restarts per level). Stopping at the first failure makes the grid cheaper, so the comparison is stricter.
    Every level runs on seeds 0..``seeds``-1 (up to ``repeats.max`` where they disagree, as the tuner's
    evidence.gather) and passes by the tuner's rule (evidence.pool: majority); each
    trial is sized like the tuner's (servetune.tuning.sizing) from what this config measured so far; an
    INVALID (or rejected) one is re-run once on the same seed, bigger."""
    runner = SimTrialRunner(plan)
    outcomes: list[TrialOutcome] = []
    mr = plan.stages.refine.max_running_flag
    for flags in grid_configs(plan):
        variants = [lambda _lvl, f=flags: f, lambda lvl, f=flags: {**f, mr: lvl}]
        for make in variants:
            seen = CampaignState()
            for level in ramp_levels(plan):
                seen = judge_cell(plan, runner, seen, make(level), level, seeds, None, checklist)
                outcomes.extend(seen.measurements(make(level), level))
                if not pool(plan, make(level), level, seen.measurements(make(level), level)).passed:
                    break  # a sane grid stops a config's ramp at its first failing level
    return outcomes


def judge_cell(plan: TuningPlan, runner: SimTrialRunner, seen: CampaignState, flags: dict[str, Any], level: Level,
               seeds: int, size: tuple[int, int] | None, checklist: bool) -> CampaignState:
    """Seeds 0..``seeds``-1 of (flags, level) that ``seen`` lacks, at one size; then the tuner's rule for seeds
    that disagree (evidence.gather): a marginal cell gets seeds up to ``repeats.max``."""
    have = {o.seed_offset for o in seen.measurements(flags, level)
            if o.valid and (size is None or (o.requests, o.warmup) == size)}
    k = 0
    while k < seeds or (k < plan.repeats.max and pool(plan, flags, level, seen.measurements(flags, level)).marginal):
        if k not in have:
            o = measure(plan, runner, seen, flags, level, k, size, checklist)
            size = size or (o.requests, o.warmup)
            seen = seen.add(o)
        k += 1
    return seen


def measure(plan: TuningPlan, runner: SimTrialRunner, seen: CampaignState, flags: dict[str, Any], level: Level,
            seed: int, size: tuple[int, int] | None, checklist: bool) -> TrialOutcome:
    """One seed of (flags, level) at ``size`` (else sized from ``seen``), re-run once bigger when INVALID, and
    once at the tuner's settled size when its p99 or latency-growth verdict is unsettled (evidence.unsettled)."""
    o, known, grow = None, seen, None
    for _attempt in range(2 + plan.repeats.invalid_retries):
        if grow is not None:
            requests, warmup, how = grow[0], o.warmup, grow[1]  # type: ignore[union-attr]
        elif size is not None and o is None:
            requests, warmup, how = size[0], size[1], "the level's size"
        elif o is not None and o.valid:
            break
        else:  # sized as the tuner sizes a re-run: from all it knows, the INVALID attempts included
            requests, warmup, how = size_trial(plan, known, flags, level, "ramp", resize_from=o)
        spec = TrialSpec(stage="refine", **plan.load_at(level), flags=flags, requests=requests, warmup=warmup,
                         reason="grid", sizing=how, seed_offset=seed)
        rep = runner.run(spec, experiment_id="grid")
        if checklist:
            check_trial(plan, rep.result)
        was_grown = grow is not None
        o = TrialOutcome.from_result(spec, rep.result, gpu_seconds=rep.gpu_seconds, restarted=rep.restarted)
        known = known.add(o)
        grow = None if was_grown or not o.valid else unsettled(plan, o)
        if grow is None and (o.valid or judge(o, plan.sla).kind == "overload"):
            break
    assert o is not None
    return o


def cells(plan: TuningPlan, outcomes: list[TrialOutcome]) -> dict[tuple[str, Level], Evidence]:
    """The grid's cells: each (config, level) pooled over its seeds by the tuner's rules."""
    by_key: dict[tuple[str, Level], list[TrialOutcome]] = {}
    for o in outcomes:
        by_key.setdefault(o.key, []).append(o)
    return {k: pool(plan, os_[0].flags, k[1], os_) for k, os_ in by_key.items()}


def best_cell(plan: TuningPlan, outcomes: list[TrialOutcome]) -> Evidence | None:
    passing = [e for e in cells(plan, outcomes).values() if e.passed]
    return max(passing, key=lambda e: e.goodput.mean or 0.0, default=None)


def on_seeds(plan: TuningPlan, staged: list[TrialOutcome], flags: dict[str, Any], level: Level, seeds: int,
             checklist: bool) -> tuple[Evidence, float]:
    """The staged answer judged like a grid cell: its config and level pooled over the grid's seeds 0..k-1,
    from the campaign's own trials at that level's size (a seed it did not run is measured here at that
    size; the GPU seconds that took are charged to neither side)."""
    ev = current(plan, CampaignState(outcomes=staged), flags, level)
    ref = ev.outcomes[0] if ev.outcomes else None
    runner = SimTrialRunner(plan)
    # judged like a grid cell: seeds 0..k-1, up to repeats.max when they disagree; the campaign's seeds
    # beyond those count only where the rule asks for them
    seen = judge_cell(plan, runner, CampaignState(outcomes=staged), flags, level, seeds,
                      (ref.requests, ref.warmup) if ref else None, checklist)
    runner.close()
    mine = [o for o in seen.measurements(flags, level) if _sized(o, ref)]
    extra = seen.outcomes[len(staged):]
    return pool(plan, flags, level, _first_seeds(plan, mine, seeds)), sum(o.gpu_seconds for o in extra)


def _sized(o: TrialOutcome, ref: TrialOutcome | None) -> bool:
    return ref is None or (o.requests, o.warmup) == (ref.requests, ref.warmup)


def _first_seeds(plan: TuningPlan, outcomes: list[TrialOutcome], seeds: int) -> list[TrialOutcome]:
    """The trials a grid cell would be judged on: seeds 0..k-1, up to repeats.max while they disagree."""
    k = seeds
    while k < plan.repeats.max and pool(plan, outcomes[0].flags if outcomes else {}, 0,
                                        [o for o in outcomes if o.seed_offset < k]).marginal:
        k += 1
    return [o for o in outcomes if o.seed_offset < k]


def run_scenario(sc: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """One scenario, both sides: the staged campaign and the grid on the same seeds; its table row."""
    plan = make_plan(sc, args.requests, args.seeds)  # the grid's, and the staged answer's judging
    campaign = make_plan(sc, args.requests, args.seeds, args.clear_margin, args.predict)  # the staged campaign's
    t0 = time.perf_counter()
    decision, staged, _ = dry_run(campaign, SimTrialRunner(campaign), checklist=args.checklist)
    t1 = time.perf_counter()
    grid, was_cached = cached_grid(args.grid_cache, plan, [run_grid, judge_cell, measure, grid_configs],
                                   f"tuning_efficiency seeds={args.seeds} checklist={args.checklist}",
                                   lambda: run_grid(plan, args.seeds, args.checklist))
    rec = decision.recommendation
    best = best_cell(plan, grid)
    mine = on_seeds(plan, staged, rec.config, rec.concurrency, args.seeds, args.checklist)[0] if rec else None
    g_staged = (mine.goodput.mean or 0.0) if mine is not None and mine.passed else 0.0
    g_grid = (best.goodput.mean or 0.0) if best else 0.0
    print(f"# {sc.name}: staged {len(staged)} trials ({t1 - t0:.0f} s wall), grid {len(grid)}"
          f"{' (cached)' if was_cached else ''}; ({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)
    return {
        "name": sc.name, "n_s": len(staged), "n_g": len(grid),
        "invalid": f"{sum(not o.valid for o in staged)}/{sum(not o.valid for o in grid)}",
        "own": (rec.goodput_rps or 0.0) if rec else 0.0, "g_s": g_staged, "g_g": g_grid,
        "cv": best.goodput.cv if best else None, "t_s": sum(o.gpu_seconds for o in staged),
        "t_g": sum(o.gpu_seconds for o in grid), "lvl": rec.concurrency if rec else None,
        "grid_lvl": best.level if best else None, "seeds": rec.repeats if rec else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="measured requests per trial (default 200)")
    ap.add_argument("--seeds", type=int, default=3, help="workload seeds both sides are judged on (default 3)")
    ap.add_argument("--only", default=None,
                    help="run only scenarios whose name contains this (comma-separated: any of these)")
    ap.add_argument("--skip", default=None,
                    help="leave out scenarios whose name contains this (comma-separated: any of these)")
    ap.add_argument("--checklist", action="store_true",
                    help="every trial of both sides through the GX checklist (about 0.7 s a trial)")
    ap.add_argument("--jobs", type=int, default=1, help="scenarios run in parallel processes (default 1)")
    ap.add_argument("--clear-margin", type=float, default=None, metavar="M",
                    help="repeats.clear_margin in the staged campaign's plan (adaptive repeats); default none")
    ap.add_argument("--predict", action="store_true",
                    help="refine.predict in the staged campaign's plan (the calibrated simulator rules candidates out)")
    ap.add_argument("--grid-cache", default=None, metavar="DIR",
                    help="keep each scenario's grid trials here and reuse them while nothing they depend on changed")
    args = ap.parse_args()
    t_start = time.perf_counter()
    only = [x for x in (args.only or "").split(",") if x]
    skip = [x for x in (args.skip or "").split(",") if x]
    picked = [sc for sc in SCENARIOS if (not only or any(x in sc.name for x in only))
              and not any(x in sc.name for x in skip)]
    header = ("scenario", "staged trials", "grid trials", "INVALID staged/grid", "staged goodput (own seeds)",
              f"staged answer on the grid's {args.seeds} seeds", "grid best", "grid best CV across seeds",
              "goodput ratio", "staged GPU min", "grid GPU min", "GPU-time ratio", "rec. level (seeds)",
              "grid best level", "meets target")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    ok_all, rows = True, []
    worst: tuple[float, str] | None = None
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool_:  # scenarios are independent
        futures = [pool_.submit(run_scenario, sc, args) for sc in picked]
        for done in as_completed(futures):  # each row as its scenario ends: a long one holds back no other
            r = done.result()
            rows.append(r)
            gr = r["g_s"] / r["g_g"] if r["g_g"] else float("nan")
            tr = r["t_s"] / r["t_g"] if r["t_g"] else float("nan")
            ok = gr >= 0.97 and tr <= 0.30
            ok_all &= ok
            if worst is None or not gr >= worst[0]:
                worst = (gr, r["name"])
            cv = f"{r['cv']:.1%}" if r["cv"] is not None else "-"
            print(f"| {r['name']} | {r['n_s']} | {r['n_g']} | {r['invalid']} | {r['own']:.2f} | {r['g_s']:.2f} |"
                  f" {r['g_g']:.2f} | {cv} | {gr:.1%} | {r['t_s'] / 60:.1f} | {r['t_g'] / 60:.1f} | {tr:.1%} |"
                  f" {r['lvl']} ({r['seeds']}) | {r['grid_lvl']} | {'yes' if ok else 'NO'} |", flush=True)
    margin = "none" if args.clear_margin is None else f"{args.clear_margin:g}"
    print(f"\n{len(rows)} scenarios, {args.seeds} seeds, clear margin {margin},"
          f" predict {'on' if args.predict else 'off'},"
          f" {time.perf_counter() - t_start:.0f} s wall;"
          f" all meet >= 97% goodput at <= 30% GPU time: {'yes' if ok_all else 'NO'}"
          + (f"; worst goodput ratio {worst[0]:.1%} ({worst[1]})" if worst else ""))
    if rows:
        print(f"median staged GPU min per answer: {statistics.median(r['t_s'] for r in rows) / 60:.1f}"
              f" (median staged trials {statistics.median(r['n_s'] for r in rows):g})")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
