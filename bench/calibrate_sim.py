"""Fit the simulator's GPU profile to real step times measured by bench/gpu_step_times.py.

Each measured row becomes the iteration the simulator's cost model prices (servetune.sim.cost):
a prefill row is one extend pass over ``batch`` sequences of ``context`` new tokens with no cached
prefix; a decode row is one decode step of ``batch`` sequences with ``context`` tokens of KV each.
The profile's free parameters are fitted by least squares on log(predicted / measured), so every
row weighs the same whatever its size. Prints every row (measured, predicted, error), the median
absolute error overall, per phase and per model, a hold-out check (fit on one model, predict the
other) and, for contrast, the error of the uncalibrated base profile; writes the fitted profile.

    .venv/bin/python bench/calibrate_sim.py \\
        --data bench/data/step_times_h200.json --base H200 \\
        --write servetune/sim/profiles/gpu/H200-hf-eager.yaml
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from servetune.sim.cost import CostModel
from servetune.sim.profiles import GpuProfile, load_gpu_profile, load_model_profile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "bench" / "data" / "step_times_h200.json"
DEFAULT_OUT = ROOT / "servetune" / "sim" / "profiles" / "gpu" / "H200-hf-eager.yaml"
# bench/gpu_step_times.py shape -> the simulator's model profile of that shape
SHAPE_PROFILES = {"1b": "llama-1b", "8b": "llama-3.1-8b"}
# fitted GPU-profile fields: (lower bound, upper bound, starting points)
FREE = {
    "compute_efficiency": (0.05, 1.0, (0.5, 0.3)),
    "memory_efficiency": (0.05, 1.0, (0.6, 0.8)),
    "step_overhead_ms": (0.0, 50.0, (1.0, 5.0)),
    "kv_traffic_factor": (1.0, 50.0, (4.0, 1.5)),
    "launch_ms_per_layer": (0.0, 5.0, (0.3, 0.0)),
}
PHASES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Row:
    shape: str
    phase: str
    batch: int
    context: int
    ms: float  # median of the measured repetitions


def load_rows(path: Path) -> tuple[dict, list[Row]]:
    """The measurement file's meta and rows; a clear error for a row the fit cannot use."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: expected an object with a 'rows' list (bench/gpu_step_times.py output)")
    rows = []
    for i, r in enumerate(doc["rows"]):
        for key in ("shape", "phase", "batch", "context", "ms_median"):
            if key not in r:
                raise ValueError(f"{path}: rows[{i}] has no {key!r}")
        if r["shape"] not in SHAPE_PROFILES:
            raise ValueError(f"{path}: rows[{i}].shape {r['shape']!r} has no model profile; known: {sorted(SHAPE_PROFILES)}")
        if r["phase"] not in PHASES:
            raise ValueError(f"{path}: rows[{i}].phase must be prefill or decode, got {r['phase']!r}")
        if not (r["batch"] > 0 and r["context"] > 0 and r["ms_median"] > 0):
            raise ValueError(f"{path}: rows[{i}] needs positive batch, context and ms_median")
        rows.append(Row(r["shape"], r["phase"], int(r["batch"]), int(r["context"]), float(r["ms_median"])))
    return doc.get("meta", {}), rows


def predict_ms(gpu: GpuProfile, row: Row) -> float:
    """The simulator's price of the measured iteration, in ms."""
    cost = CostModel.from_profiles(load_model_profile(SHAPE_PROFILES[row.shape]), gpu)
    b, c = row.batch, row.context
    if row.phase == "decode":
        return cost.decode_s(b, b * c) * 1e3
    return cost.extend_s(new_tokens=b * c, pairs=b * c * (c + 1) / 2, ctx_read=0, seqs=b) * 1e3


def errors_pct(gpu: GpuProfile, rows: Sequence[Row]) -> np.ndarray:
    """Signed error of each prediction, % of the measured time."""
    return np.array([(predict_ms(gpu, r) / r.ms - 1) * 100 for r in rows])


def median_abs(errs: np.ndarray) -> float:
    return float(np.median(np.abs(errs))) if len(errs) else float("nan")


def fit(base: GpuProfile, rows: Sequence[Row], name: str) -> GpuProfile:
    """``base`` with the FREE fields set by least squares on log(predicted / measured).

    The step-time function is piecewise (max of roofline terms, launch floor), so the fit starts
    from two points and keeps the better optimum.
    """
    names = list(FREE)
    lo = np.array([FREE[n][0] for n in names])
    hi = np.array([FREE[n][1] for n in names])
    measured = np.array([r.ms for r in rows])

    def profile(x: np.ndarray) -> GpuProfile:
        return base.model_copy(update={"name": name, **{n: float(v) for n, v in zip(names, x)}})

    def residuals(x: np.ndarray) -> np.ndarray:
        g = profile(x)
        return np.log(np.array([predict_ms(g, r) for r in rows]) / measured)

    best = None
    for start in zip(*(FREE[n][2] for n in names)):
        res = least_squares(residuals, np.array(start, dtype=float), bounds=(lo, hi), x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    return profile(best.x)


def rounded(gpu: GpuProfile) -> GpuProfile:
    """The fitted values at the precision written to the YAML file (what the simulator will use)."""
    return gpu.model_copy(update={n: float(f"{getattr(gpu, n):.3g}") for n in FREE})


def summary(gpu: GpuProfile, rows: Sequence[Row]) -> dict:
    """Median |error| % overall, per phase and per model shape."""
    errs = errors_pct(gpu, rows)
    out = {"all": median_abs(errs), "rows": len(rows)}
    for key, values in (("phase", PHASES), ("shape", sorted({r.shape for r in rows}))):
        for v in values:
            sel = np.array([getattr(r, key) == v for r in rows])
            if sel.any():
                out[v] = median_abs(errs[sel])
    return out


def fmt_summary(title: str, s: dict) -> str:
    parts = [f"{k} {v:.1f}%" for k, v in s.items() if k not in ("all", "rows")]
    return f"{title}: median |error| {s['all']:.1f}% over {s['rows']} rows ({', '.join(parts)})"


def write_profile(gpu: GpuProfile, path: Path, meta: dict, fitted: dict, base_name: str, data: Path) -> None:
    header = [
        f"# {gpu.name}: NVIDIA H200 running HuggingFace transformers in eager mode (SDPA attention, no CUDA",
        "# graphs, bf16) -- NOT SGLang (use the H200 profile for that). Fitted by bench/calibrate_sim.py to",
        f"# {data.name} ({meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, measured {meta.get('date', '?')}):",
        f"# median |step-time error| {fitted['all']:.1f}% over {fitted['rows']} prefill/decode rows of a 1B and an 8B",
        f"# Llama shape. Spec-sheet peaks and memory are the {base_name} profile's; see docs/sim.md, Calibration.",
    ]
    body = yaml.safe_dump(gpu.model_dump(), sort_keys=False)
    path.write_text("\n".join(header) + "\n" + body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="bench/gpu_step_times.py output")
    ap.add_argument("--base", default="H200", help="GPU profile giving the peaks (and the uncalibrated contrast)")
    ap.add_argument("--name", default="H200-hf-eager", help="name of the fitted profile")
    ap.add_argument("--write", type=Path, default=None, help=f"write the fitted profile here (e.g. {DEFAULT_OUT.relative_to(ROOT)})")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure as JSON")
    a = ap.parse_args()

    meta, rows = load_rows(a.data)
    base = load_gpu_profile(a.base)
    fitted = rounded(fit(base, rows, a.name))
    errs = errors_pct(fitted, rows)
    base_errs = errors_pct(base, rows)

    print(f"data: {a.data} ({meta.get('gpu', '?')}, {meta.get('engine', '?')}, {meta.get('date', '?')})")
    print("fitted: " + ", ".join(f"{n}={getattr(fitted, n):g}" for n in FREE))
    print(f"\n{'model':5} {'phase':7} {'batch':>5} {'context':>7} {'measured ms':>11} {'predicted':>9} {'error':>7}"
          f" | {a.base + ' (uncal.)':>14} {'error':>7}")
    for r, e, be in zip(rows, errs, base_errs):
        print(f"{r.shape:5} {r.phase:7} {r.batch:5d} {r.context:7d} {r.ms:11.2f} {predict_ms(fitted, r):9.2f} {e:+6.1f}%"
              f" | {predict_ms(base, r):14.2f} {be:+6.1f}%")

    in_sample = summary(fitted, rows)
    uncal = summary(base, rows)
    holdout = {}
    print()
    print(fmt_summary(f"calibrated {a.name} (in sample)", in_sample))
    print(fmt_summary(f"uncalibrated {a.base}", uncal))
    for train in sorted({r.shape for r in rows}):
        train_rows = [r for r in rows if r.shape == train]
        test_rows = [r for r in rows if r.shape != train]
        g = rounded(fit(base, train_rows, f"{a.name}-fit-{train}"))
        holdout[train] = {"params": {n: getattr(g, n) for n in FREE}, "train": summary(g, train_rows),
                          "test": summary(g, test_rows)}
        print(fmt_summary(f"hold-out: fit on {train}, predict the others", holdout[train]["test"])
              + f"  [in-sample {holdout[train]['train']['all']:.1f}%; "
              + ", ".join(f"{n}={getattr(g, n):g}" for n in FREE) + "]")
    compute_bound = [r for r in rows if r.phase == "prefill" and r.batch * r.context >= 2048]
    cb = summary(base, compute_bound)
    print(fmt_summary(f"{a.base} on compute-bound rows (prefill >= 2048 tokens)", cb))

    if a.write:
        write_profile(fitted, a.write, meta, in_sample, a.base, a.data)
        print(f"\nwrote {a.write}")
    if a.json:
        a.json.write_text(json.dumps({
            "meta": meta, "base": a.base, "fitted": fitted.model_dump(), "in_sample": in_sample,
            "uncalibrated": uncal, "holdout": holdout, "base_compute_bound": cb,
            "rows": [dict(shape=r.shape, phase=r.phase, batch=r.batch, context=r.context, measured_ms=r.ms,
                          predicted_ms=predict_ms(fitted, r), error_pct=e, base_error_pct=be)
                     for r, e, be in zip(rows, errs, base_errs)],
        }, indent=1))


if __name__ == "__main__":
    main()
