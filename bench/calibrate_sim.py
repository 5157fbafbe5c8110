"""Fit the simulator's GPU profile to real step times: bench/gpu_step_times.py rows or SGLang's own log.

Each measured row becomes the iteration the simulator's cost model prices (servetune.sim.cost):
a prefill row is one extend pass over ``batch`` sequences of ``context`` new tokens (``cached``
prefix tokens each read from the cache); a decode row is one decode step of ``batch`` sequences
with ``context`` tokens of KV each. The profile's free parameters are fitted by least squares on
log(predicted / measured), so every row weighs the same whatever its size.

Two inputs. ``--data``: bench/gpu_step_times.py output (HF transformers eager passes; prints every
row, a hold-out across model sizes and the base profile's error). ``--from-sglang-trials``: kept
real-SGLang trials (campaign dirs or their .tar.xz), whose scheduler-log lines become rows
(servetune.sim.sglang_steps); rows are weighted so each (phase, batch-size octave) bin counts the
same, the loss is robust (soft L1: a step whose gap held something else does not pull the fit),
``launch_ms_per_layer`` stays 0 (CUDA graphs) and ``--holdout-sglang-trials`` prices other
trials' rows with the fitted profile.

    .venv/bin/python bench/calibrate_sim.py \\
        --data bench/data/step_times_h200.json --base H200 \\
        --write servetune/sim/profiles/gpu/H200-transformers-eager.yaml
    .venv/bin/python bench/calibrate_sim.py --base H200 --name H200-sglang \\
        --from-sglang-trials tests/data/gpu-h200-sglang/tune-b.tar.xz \\
        --holdout-sglang-trials tests/data/gpu-h200-sglang/tune-c.tar.xz \\
        --write servetune/sim/profiles/gpu/H200-sglang.yaml
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from servetune.sim.cost import CostModel
from servetune.sim.profiles import GpuProfile, load_gpu_profile, load_model_profile
from servetune.sim.sglang_steps import load_trials, step_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "bench" / "data" / "step_times_h200.json"
DEFAULT_OUT = ROOT / "servetune" / "sim" / "profiles" / "gpu" / "H200-transformers-eager.yaml"
# row shape -> the simulator's model profile of that shape (8b-v32k: the real-SGLang runs' model)
SHAPE_PROFILES = {"1b": "llama-1b", "8b": "llama-3.1-8b", "8b-v32k": "llama-8b-v32k"}
SGLANG_SHAPE = "8b-v32k"
# fitted GPU-profile fields: (lower bound, upper bound, starting points)
FREE = {
    "compute_efficiency": (0.05, 1.0, (0.5, 0.3)),
    "memory_efficiency": (0.05, 1.0, (0.6, 0.8)),
    "step_overhead_ms": (0.0, 50.0, (1.0, 5.0)),
    "kv_traffic_factor": (1.0, 50.0, (4.0, 1.5)),
    "launch_ms_per_layer": (0.0, 5.0, (0.3, 0.0)),
}
# SGLang replays CUDA graphs: no host launch floor to fit
SGLANG_FREE = ("compute_efficiency", "memory_efficiency", "step_overhead_ms", "kv_traffic_factor")
PHASES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Row:
    shape: str
    phase: str
    batch: int
    context: float  # tokens per sequence: new ones (prefill) or held in KV (decode)
    ms: float  # measured step time (median of the repetitions, or one logged step)
    cached: float = 0.0  # prefill: prefix tokens per sequence read from the cache

    @property
    def bin(self) -> str:
        """Phase and batch-size octave (decode) or new-token octave (prefill): the weighting and report unit."""
        size = self.batch if self.phase == "decode" else self.batch * self.context
        lo = 2 ** int(math.log2(max(size, 1)))
        return f"{self.phase} {'b' if self.phase == 'decode' else 'tok'} {lo}-{2 * lo - 1}"


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
            raise ValueError(f"{path}: rows[{i}].shape {r['shape']!r} has no model profile;"
                             f" known: {sorted(SHAPE_PROFILES)}")
        if r["phase"] not in PHASES:
            raise ValueError(f"{path}: rows[{i}].phase must be prefill or decode, got {r['phase']!r}")
        if not (r["batch"] > 0 and r["context"] > 0 and r["ms_median"] > 0):
            raise ValueError(f"{path}: rows[{i}] needs positive batch, context and ms_median")
        rows.append(Row(r["shape"], r["phase"], int(r["batch"]), int(r["context"]), float(r["ms_median"])))
    return doc.get("meta", {}), rows


def load_sglang_rows(paths: Sequence[Path]) -> tuple[dict, list[Row]]:
    """Rows from the scheduler logs of every trial under ``paths`` (servetune.sim.sglang_steps)."""
    trials = load_trials(paths)
    rows = [Row(SGLANG_SHAPE, r["phase"], r["batch"], r["context"], r["ms"], r["cached"])
            for t in trials for r in step_rows(t)]
    if not rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no trial with usable scheduler-log lines")
    env = trials[0].get("environment") or {}
    info = (trials[0].get("server") or {}).get("server_info") or {}
    meta = {"gpu": env.get("gpu_model", "?"), "engine": f"sglang {info.get('version', '?')}",
            "attention": info.get("attention_backend", "?"), "date": str(trials[0].get("created_at", "?"))[:10],
            "trials": len(trials), "sources": [Path(p).name for p in paths]}
    return meta, rows


def predict_all(gpu: GpuProfile, rows: Sequence[Row]) -> np.ndarray:
    """The simulator's price of each measured iteration, in ms."""
    costs = {s: CostModel.from_profiles(load_model_profile(SHAPE_PROFILES[s]), gpu) for s in {r.shape for r in rows}}
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        cost, b, c = costs[r.shape], r.batch, r.context
        if r.phase == "decode":
            out[i] = cost.decode_s(b, round(b * c)) * 1e3
        else:
            new = round(b * c)
            out[i] = cost.extend_s(new_tokens=new, pairs=b * c * (r.cached + (c + 1) / 2), ctx_read=round(b * r.cached),
                                   seqs=b) * 1e3
    return out


def predict_ms(gpu: GpuProfile, row: Row) -> float:
    return float(predict_all(gpu, [row])[0])


def errors_pct(gpu: GpuProfile, rows: Sequence[Row]) -> np.ndarray:
    """Signed error of each prediction, % of the measured time."""
    return (predict_all(gpu, rows) / np.array([r.ms for r in rows]) - 1) * 100


def median_abs(errs: np.ndarray) -> float:
    return float(np.median(np.abs(errs))) if len(errs) else float("nan")


def bin_weights(rows: Sequence[Row]) -> np.ndarray:
    """1 / rows in the row's bin: each bin weighs the same, however often that batch shape ran."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.bin] = counts.get(r.bin, 0) + 1
    return np.array([1.0 / counts[r.bin] for r in rows])


def fit(base: GpuProfile, rows: Sequence[Row], name: str, free: Sequence[str] = tuple(FREE),
        weights: np.ndarray | None = None, loss: str = "linear") -> GpuProfile:
    """``base`` with the ``free`` fields set by least squares on log(predicted / measured).

    The step-time function is piecewise (max of roofline terms, launch floor), so the fit starts
    from two points and keeps the better optimum.
    """
    names = list(free)
    lo = np.array([FREE[n][0] for n in names])
    hi = np.array([FREE[n][1] for n in names])
    measured = np.array([r.ms for r in rows])
    w = np.sqrt(weights / weights.mean()) if weights is not None else 1.0

    def profile(x: np.ndarray) -> GpuProfile:
        return base.model_copy(update={"name": name, **{n: float(v) for n, v in zip(names, x, strict=True)}})

    def residuals(x: np.ndarray) -> np.ndarray:
        return w * np.log(predict_all(profile(x), rows) / measured)

    best = None
    for start in zip(*(FREE[n][2] for n in names), strict=True):
        res = least_squares(residuals, np.array(start, dtype=float), bounds=(lo, hi), x_scale="jac",
                            loss=loss, f_scale=0.1)
        if best is None or res.cost < best.cost:
            best = res
    return profile(best.x)


def rounded(gpu: GpuProfile, free: Sequence[str] = tuple(FREE)) -> GpuProfile:
    """The fitted values at the precision written to the YAML file (what the simulator will use)."""
    return gpu.model_copy(update={n: float(f"{getattr(gpu, n):.3g}") for n in free})


def summary(gpu: GpuProfile, rows: Sequence[Row], by: str = "shape") -> dict:
    """Median |error| % overall, per phase and per model shape (``by="bin"``: per phase-and-size bin)."""
    errs = errors_pct(gpu, rows)
    out = {"all": median_abs(errs), "rows": len(rows)}
    for key, values in (("phase", PHASES), (by, sorted({getattr(r, by) for r in rows}))):
        for v in values:
            sel = np.array([getattr(r, key) == v for r in rows])
            if sel.any():
                out[v] = median_abs(errs[sel])
    return out


def fmt_summary(title: str, s: dict) -> str:
    parts = [f"{k} {v:.1f}%" for k, v in s.items() if k not in ("all", "rows")]
    return f"{title}: median |error| {s['all']:.1f}% over {s['rows']} rows ({', '.join(parts)})"


def bin_table(fitted: GpuProfile, base: GpuProfile, rows: Sequence[Row]) -> list[dict]:
    """Per bin: rows, median measured and predicted ms, median |error| of the fit and of the base."""
    errs, base_errs, pred = errors_pct(fitted, rows), errors_pct(base, rows), predict_all(fitted, rows)
    out = []
    for b in sorted({r.bin for r in rows}, key=lambda s: (s.split()[0], int(s.split()[2].split("-")[0]))):
        sel = np.array([r.bin == b for r in rows])
        sub = [r for r, s in zip(rows, sel, strict=True) if s]
        out.append({"bin": b, "rows": len(sub), "context": float(np.median([r.context for r in sub])),
                    "measured_ms": float(np.median([r.ms for r in sub])), "predicted_ms": float(np.median(pred[sel])),
                    "error_pct": median_abs(errs[sel]), "base_error_pct": median_abs(base_errs[sel])})
    return out


def write_profile(gpu: GpuProfile, path: Path, header: Sequence[str]) -> None:
    body = yaml.safe_dump(gpu.model_dump(), sort_keys=False)
    path.write_text("".join(f"# {h}\n" for h in header) + body)


def eager_header(gpu: GpuProfile, meta: dict, fitted: dict, base_name: str, data: Path) -> list[str]:
    return [
        f"{gpu.name}: NVIDIA H200 running HuggingFace transformers in eager mode (SDPA attention, no CUDA",
        "graphs, bf16) -- NOT SGLang (use H200-sglang for that). Fitted by bench/calibrate_sim.py to",
        f"{data.name} ({meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, measured {meta.get('date', '?')}):",
        f"median |step-time error| {fitted['all']:.1f}% over {fitted['rows']} prefill/decode rows of a 1B and an 8B",
        f"Llama shape. Spec-sheet peaks and memory are the {base_name} profile's; see docs/sim.md, Calibration.",
    ]


def sglang_header(gpu: GpuProfile, meta: dict, fitted: dict, base_name: str, paths: Sequence[Path]) -> list[str]:
    srcs = " ".join(str(Path(p).resolve().relative_to(ROOT)) if Path(p).resolve().is_relative_to(ROOT) else str(p)
                    for p in paths)
    return [
        f"{gpu.name}: {meta['engine']} on an {meta['gpu']} ({meta['attention']} attention, CUDA graphs, overlap",
        f"scheduler, bf16). Fitted by bench/calibrate_sim.py to {fitted['rows']} step times from SGLang's own",
        f"scheduler log ({meta['trials']} trials of {', '.join(meta['sources'])}, {meta['date']};"
        " random-weight 7.24B Llama,",
        f"model profile {SHAPE_PROFILES[SGLANG_SHAPE]}): median |step-time error| {fitted['all']:.1f}%"
        f" (prefill {fitted['prefill']:.1f}%,",
        f"decode {fitted['decode']:.1f}%).",
        f"  .venv/bin/python bench/calibrate_sim.py --base {base_name} --name {gpu.name}"
        f" --from-sglang-trials {srcs} \\",
        f"      --write servetune/sim/profiles/gpu/{gpu.name}.yaml",
        f"Peaks and memory are the {base_name} profile's; end-to-end error: bench/sim_vs_sglang.py, docs/sim.md.",
    ]


def main_sglang(a: argparse.Namespace, base: GpuProfile) -> None:
    meta, rows = load_sglang_rows(a.from_sglang_trials)
    fitted = rounded(fit(base, rows, a.name, SGLANG_FREE, bin_weights(rows), "soft_l1"), SGLANG_FREE)
    print(f"data: {', '.join(meta['sources'])} ({meta['trials']} trials, {meta['engine']}, {meta['gpu']}):"
          f" {len(rows)} rows")
    print("fitted: " + ", ".join(f"{n}={getattr(fitted, n):g}" for n in SGLANG_FREE) + " (launch_ms_per_layer 0)")
    sets = {"in sample": rows}
    if a.holdout_sglang_trials:
        sets["held out"] = load_sglang_rows(a.holdout_sglang_trials)[1]
    doc = {"meta": meta, "base": a.base, "fitted": fitted.model_dump()}
    for label, rs in sets.items():
        table = bin_table(fitted, base, rs)
        print(f"\n{label}: | bin | rows | context | measured ms | {a.name} ms | error | {a.base} error |")
        for t in table:
            print(f"| {t['bin']} | {t['rows']} | {t['context']:.0f} | {t['measured_ms']:.2f} |"
                  f" {t['predicted_ms']:.2f} | {t['error_pct']:.1f}% | {t['base_error_pct']:.1f}% |")
        s, sb = summary(fitted, rs, by="bin"), summary(base, rs, by="bin")
        print(fmt_summary(f"{a.name} ({label})", {k: s[k] for k in ("all", "rows", *PHASES) if k in s}))
        print(fmt_summary(f"{a.base} uncalibrated ({label})", {k: sb[k] for k in ("all", "rows", *PHASES) if k in sb}))
        doc[label] = {"summary": s, "base_summary": sb, "bins": table}
    if a.write:
        write_profile(fitted, a.write, sglang_header(fitted, meta, summary(fitted, rows), a.base, a.from_sglang_trials))
        print(f"\nwrote {a.write}")
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="bench/gpu_step_times.py output")
    ap.add_argument("--from-sglang-trials", type=Path, nargs="+", metavar="DIR_OR_ARCHIVE",
                    help="fit to the scheduler logs of these kept real-SGLang trials instead of --data")
    ap.add_argument("--holdout-sglang-trials", type=Path, nargs="+", metavar="DIR_OR_ARCHIVE",
                    help="with --from-sglang-trials: also price these trials' steps (not fitted on)")
    ap.add_argument("--base", default="H200", help="GPU profile giving the peaks (and the uncalibrated contrast)")
    ap.add_argument("--name", default=None, help="name of the fitted profile (H200-transformers-eager / H200-sglang)")
    ap.add_argument("--write", type=Path, default=None,
                    help=f"write the fitted profile here (e.g. {DEFAULT_OUT.relative_to(ROOT)})")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure as JSON")
    a = ap.parse_args()
    base = load_gpu_profile(a.base)
    if a.from_sglang_trials:
        a.name = a.name or "H200-sglang"
        return main_sglang(a, base)
    a.name = a.name or "H200-transformers-eager"

    meta, rows = load_rows(a.data)
    fitted = rounded(fit(base, rows, a.name))
    errs = errors_pct(fitted, rows)
    base_errs = errors_pct(base, rows)
    pred, base_pred = predict_all(fitted, rows), predict_all(base, rows)

    print(f"data: {a.data} ({meta.get('gpu', '?')}, {meta.get('engine', '?')}, {meta.get('date', '?')})")
    print("fitted: " + ", ".join(f"{n}={getattr(fitted, n):g}" for n in FREE))
    print(f"\n{'model':5} {'phase':7} {'batch':>5} {'context':>7} {'measured ms':>11} {'predicted':>9} {'error':>7}"
          f" | {a.base + ' (uncal.)':>14} {'error':>7}")
    for r, e, be, p, bp in zip(rows, errs, base_errs, pred, base_pred, strict=True):
        print(f"{r.shape:5} {r.phase:7} {r.batch:5d} {r.context:7.0f} {r.ms:11.2f} {p:9.2f} {e:+6.1f}%"
              f" | {bp:14.2f} {be:+6.1f}%")

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
        write_profile(fitted, a.write, eager_header(fitted, meta, in_sample, a.base, a.data))
        print(f"\nwrote {a.write}")
    if a.json:
        a.json.write_text(json.dumps({
            "meta": meta, "base": a.base, "fitted": fitted.model_dump(), "in_sample": in_sample,
            "uncalibrated": uncal, "holdout": holdout, "base_compute_bound": cb,
            "rows": [{"shape": r.shape, "phase": r.phase, "batch": r.batch, "context": r.context, "measured_ms": r.ms,
                      "predicted_ms": p, "error_pct": e, "base_error_pct": be}
                     for r, e, be, p in zip(rows, errs, base_errs, pred, strict=True)],
        }, indent=1))


if __name__ == "__main__":
    main()
