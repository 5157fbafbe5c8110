"""The simulator's prediction against real SGLang trials, per GPU profile: fitted vs unfitted.

Each kept real-SGLang trial (tests/data/gpu-h200-sglang, SGLang 0.5.17 on an H200, a random 7.24B
Llama: the repeat study, campaign tune-a, and tune-c, which H200-sglang was not fitted on; tune-b,
which it was fitted on, only with ``--in-sample``) is replayed in virtual time with the same
workload spec and seed, request count, warm-up, concurrency and the trial's modelled SGLang flags
(chunked-prefill-size, schedule-conservativeness, max-running-requests, mem-fraction-static).
INVALID trials are left out and counted. Printed: per trial the measured and predicted output
tok/s, TPOT p50 and TTFT p50 with the relative error for each ``--gpu`` profile, then the median
absolute error per level and overall (the target for a calibrated profile: <= 10% on throughput
and TPOT). The ``openloop`` set (``servetune bench --rate`` at 8, 16 and 24 Poisson req/s against
one default-flag server, openloop.tar.xz) is replayed in virtual time under the same arrivals.

    .venv/bin/python bench/sim_vs_sglang.py [--gpu H200-sglang H200] [--model llama-8b-v32k] [--in-sample]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import orjson

from servetune.loadgen import LoadConfig
from servetune.plan import load_plan
from servetune.sim.args import modelled
from servetune.sim.sglang_steps import load_trials
from servetune.sim.virtual import simulate
from servetune.workload import WorkloadSpec, build_requests

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu-h200-sglang"
PLAN = REPO / "plans" / "gpu-h200-sglang.yaml"
FIGURES = (("output tok/s", lambda s: s["output_tokens_per_s"]), ("TPOT p50 ms", lambda s: s["tpot_ms"]["p50"]),
           ("TTFT p50 ms", lambda s: s["ttft_ms"]["p50"]))
HELD_OUT = ("study", "tune-a", "tune-c", "openloop")
SETS = ("study", "tune-a", "tune-b", "tune-c", "openloop")
NAMES = tuple(n for n, _ in FIGURES)
SPAN = "run span s"  # whole trial, first send to last completion: no steady-window edge in it
SIM_FLAGS = {"mem-fraction-static": 0.8, "enable-metrics": True, "enable-cache-report": True}


def _campaign_state(name: str) -> dict:
    folder = DATA / name
    if (folder / "state.json").is_file():
        return orjson.loads((folder / "state.json").read_bytes())
    with tarfile.open(DATA / f"{name}.tar.xz") as tar:
        return orjson.loads(tar.extractfile(f"{name}/state.json").read())  # type: ignore[union-attr]


def _spans(name: str) -> dict[str, float]:
    """trial id -> seconds from the first send to the last completion, for the trial files kept."""
    where = DATA / name if (DATA / name).is_dir() else DATA / f"{name}.tar.xz"
    return {t["trial_id"]: t["load"]["drain_end_s"] for t in load_trials([where])
            if t.get("load", {}).get("drain_end_s")}


def _resummarized(trial: dict) -> dict:
    """An open-loop trial's figures under today's definitions (its set: the window's arrivals), from its
    records; the stored summary came from an older set (what completed in the window), and the kept
    records have no per-chunk arrays, so validity stays the stored one."""
    from servetune.metrics import summarize
    from servetune.result import TrialResult
    from servetune.validity import ValidityRules

    t = TrialResult.from_dict(trial)
    s = summarize(t.records, load=t.load, rules=ValidityRules(**t.summary.validity_rules), sla=None, gpu=None,
                  server=None, lengths_exact=True).model_dump()
    return {**s, "valid": trial["summary"]["valid"]}


def real_trials(sets: Sequence[str] = HELD_OUT) -> tuple[list[dict], dict[str, int]]:
    """(the kept trials with a VALID summary, INVALID ones left out per set); correctness checks are INVALID.

    ``span`` (the whole run, first send to last completion) where the trial file is kept (tune-c, tune-b).
    """
    out, invalid = [], {}
    for name in sets:
        rows = []
        spans = {} if name == "study" else _spans(name)
        if name == "openloop":
            for t in load_trials([DATA / "openloop.tar.xz"]):
                load = {k: v for k, v in t["load"].items() if not k.endswith("_s") and k != "requests"}
                rows.append({"source": f"openloop {load['rate']:g} req/s", "level": load["concurrency"],
                             "requests": t["load"]["requests"], "warmup": load["warmup_requests"], "seed_offset": None,
                             "seed": t["workload"]["spec"]["seed"], "flags": {}, "summary": _resummarized(t),
                             "span": t["load"].get("drain_end_s"), "load": load,
                             "spec": t["workload"]["spec"]})
        elif name == "study":
            for row in orjson.loads((DATA / "study.json").read_bytes())["trials"]:
                rows.append({"source": f"study {row['file']}", "level": row["level"], "requests": row["requests"],
                             "warmup": 16, "seed_offset": None, "seed": row["seed"], "flags": {},
                             "summary": row["summary"], "span": None})
        else:
            for o in _campaign_state(name)["outcomes"]:
                rows.append({"source": f"{name} {o['trial_id'][:8]}", "level": o["concurrency"],
                             "requests": o["requests"], "warmup": o["warmup"], "seed": None,
                             "seed_offset": o.get("seed_offset", 0), "flags": modelled(o.get("flags") or {}),
                             "summary": o["summary"], "span": spans.get(o["trial_id"])})
        invalid[name] = sum(not r["summary"].get("valid") for r in rows)
        out.extend({**r, "set": name} for r in rows if r["summary"].get("valid"))
    return out, invalid


def replay(trial: dict, gpu: str, model: str) -> dict:
    """The simulator's summary of ``trial``'s workload, load and flags on profiles ``gpu`` and ``model``
    (plus ``span``: the virtual seconds from the first send to the last completion)."""
    plan = load_plan(PLAN)
    base = WorkloadSpec(**trial["spec"]) if trial.get("spec") else plan.workload
    base = base.model_copy(update={"tokenizer": None})  # the simulator counts its own tokens
    seed = trial["seed"] if trial["seed"] is not None else base.seed + (trial["seed_offset"] or 0)
    reqs = build_requests(base.model_copy(update={"seed": seed}), trial["warmup"] + trial["requests"]).requests
    flags = {**SIM_FLAGS, **trial["flags"], "gpu-profile": gpu, "model-profile": model}
    load = LoadConfig(**trial["load"]) if trial.get("load") else LoadConfig(
        concurrency=trial["level"], warmup_requests=trial["warmup"], seed=seed)
    res = simulate(flags, reqs, load)
    return {**res.summary.model_dump(), "span": res.environment["virtual_duration_s"]}


def compare(trials: Sequence[dict], gpus: Sequence[str], model: str) -> list[dict]:
    """Per trial: the real figures and, per profile, the predicted ones and their signed relative errors."""
    out = []
    for t in trials:
        row = {"trial": t, "real": {n: get(t["summary"]) for n, get in FIGURES}, "sim": {}, "err": {}}
        row["real"][SPAN] = t["span"]
        for gpu in gpus:
            sim = replay(t, gpu, model)
            row["sim"][gpu] = {n: get(sim) for n, get in FIGURES}
            row["sim"][gpu][SPAN] = sim["span"]
            row["err"][gpu] = {n: (row["sim"][gpu][n] / row["real"][n] - 1) if row["real"][n] and row["sim"][gpu][n]
                               else None for n in (*NAMES, SPAN)}
        out.append(row)
    return out


def median_abs(rows: Sequence[dict], gpu: str, figure: str) -> float | None:
    errs = [abs(r["err"][gpu][figure]) for r in rows if r["err"][gpu][figure] is not None]
    return statistics.median(errs) if errs else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def report(rows: Sequence[dict], gpus: Sequence[str]) -> str:
    """Markdown: every trial, then median |error| per level, per set and overall, per profile."""
    figs = (*NAMES, SPAN) if any(r["real"][SPAN] for r in rows) else NAMES
    lines = ["| trial | level | flags | " + " | ".join(f"{n} real / " + " / ".join(gpus) for n in figs) + " |",
             "|---|---|---|" + "---|" * len(figs)]
    for r in sorted(rows, key=lambda r: (r["trial"]["level"], r["trial"]["source"])):
        t = r["trial"]
        flags = ", ".join(f"{k} {v}" for k, v in t["flags"].items() if k != "mem-fraction-static") or "-"
        cells = []
        for n in figs:
            if r["real"][n] is None:
                cells.append("-")
                continue
            sims = " / ".join(f"{r['sim'][g][n]:.1f} ({r['err'][g][n]:+.0%})" if r["err"][g][n] is not None else "-"
                              for g in gpus)
            cells.append(f"{r['real'][n]:.1f} / {sims}")
        lines.append(f"| {t['source']} | {t['level']} | {flags} | " + " | ".join(cells) + " |")
    closed = [r for r in rows if not r["trial"].get("load")]
    groups = [(f"level {lv}", [r for r in closed if r["trial"]["level"] == lv])
              for lv in sorted({r["trial"]["level"] for r in closed})]
    groups += [(f"set {s}", [r for r in rows if r["trial"]["set"] == s])
               for s in dict.fromkeys(r["trial"]["set"] for r in rows)]
    groups.append(("all", list(rows)))
    lines += ["", "median \\|error\\| | trials | " + " | ".join(f"{n} {g}" for n in figs for g in gpus) + " |",
              "|---|---|" + "---|" * (len(figs) * len(gpus))]
    for label, sel in groups:
        lines.append(f"| {label} | {len(sel)} | " + " | ".join(_pct(median_abs(sel, g, n)) for n in figs
                                                           for g in gpus) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", nargs="+", default=["H200-sglang", "H200"], help="GPU profiles to compare")
    ap.add_argument("--model", default="llama-8b-v32k", help="model profile (the runs' 7.24B, vocab 32k)")
    ap.add_argument("--sets", nargs="+", default=list(HELD_OUT), choices=SETS)
    ap.add_argument("--in-sample", action="store_true", help="add tune-b, the campaign H200-sglang was fitted on")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure as JSON")
    args = ap.parse_args()
    sets = [*args.sets, *(["tune-b"] if args.in_sample and "tune-b" not in args.sets else [])]
    trials, invalid = real_trials(sets)
    rows = compare(trials, args.gpu, args.model)
    print(report(rows, args.gpu))
    print("\nINVALID trials left out: " + ", ".join(f"{s} {n}" for s, n in invalid.items())
          + f" ({sum(invalid.values())})")
    if args.json:
        args.json.write_bytes(orjson.dumps({"invalid": invalid, "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
