"""The simulator's VLM profile and SGLang's front end against real SGLang 0.5.17 VLM trials (issue 30 item 6).

Every kept VALID trial of tests/data/gpu-h200-vlm/2026-12-04 (radix cache on / off and
``--mm-processor-worker-num 8``, workloads vlm-radix-r90 / r50, seeds 1-3) and 2026-12-04-scenarios
(scenario 1 at ``--chunked-prefill-size`` 8192 and 1024, the image position pair) is replayed in virtual
time with its workload spec and seed, request count, warm-up, concurrency and the flags the simulator
models, on model profile qwen2.5-vl-7b and GPU profile H200-sglang. Printed: per trial the measured and
predicted req/s, output tok/s, TTFT p50 and TPOT p50 with relative errors, then the median |error| of
the trials fitted on (seed 1) and held out (seeds 2-3), per experiment.

``--fit`` fits the VLM's front-end and vision parameters on the seed-1 trials only (Nelder-Mead on the
mean absolute log error of req/s, TPOT p50 and TTFT p50, from the profile's values), ``--fit-text`` the
text front end's fixed latency on the three open-loop text trials (bench/sim_vs_sglang.py's ``openloop``
set, the llama-8b-v32k profile); ``--write`` puts the result into the model profile(s).

    .venv/bin/python bench/sim_vs_sglang_vlm.py [--jobs 2] [--fit-text] [--fit] [--write] [--json F]
        [--predict-workers 1 2 4 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import re
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from servetune.loadgen import LoadConfig
from servetune.sim.profiles import BUILTIN_DIR, load_model_profile
from servetune.sim.virtual import simulate
from servetune.workload import WorkloadSpec, build_requests

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu-h200-vlm"
ARCHIVES = (DATA / "2026-12-04" / "trials.tar.xz", DATA / "2026-12-04-scenarios" / "trials.tar.xz")
MODEL, GPU, TEXT_MODEL = "qwen2.5-vl-7b", "H200-sglang", "llama-8b-v32k"
MODEL_DIR = BUILTIN_DIR / "model"
SIM_FLAGS = {"enable-metrics": True, "enable-cache-report": True, "mem-fraction-static": 0.815}
FIGURES: dict[str, Callable[[dict], float]] = {
    "req/s": lambda s: s["request_throughput"], "output tok/s": lambda s: s["output_tokens_per_s"],
    "TTFT p50 ms": lambda s: s["ttft_ms"]["p50"], "TPOT p50 ms": lambda s: s["tpot_ms"]["p50"]}
FITTED = ("req/s", "TPOT p50 ms", "TTFT p50 ms")  # what the fit minimises (output tok/s is req/s x 128)
TARGETS = {"req/s": 0.15, "output tok/s": 0.15, "TTFT p50 ms": 0.15, "TPOT p50 ms": 0.10}  # held out, issue 30


def experiment(trial: dict) -> str:
    """The comparison a trial belongs to, from the server SGLang resolved and the workload."""
    info, name = trial["server"]["server_info"], trial["workload"]["name"]
    if name.startswith("vlm-radix"):
        reuse = name.rsplit("-", 1)[1]
        if info.get("mm_processor_worker_num"):
            return f"radix on, mm workers {info['mm_processor_worker_num']}, {reuse}"
        return f"radix {'off' if info.get('disable_radix_cache') else 'on'}, {reuse}"
    if name == "vlm-scenario1":
        return f"scenario 1, chunk {info['chunked_prefill_size']}"
    return {"vlm-position-text": "images after the system prompt",
            "vlm-position-system": "images before the system prompt"}.get(name, name)


def modelled_flags(info: dict[str, Any]) -> dict[str, Any]:
    """The trial's server flags that the simulator models, as SGLang resolved them (the rest are defaults)."""
    out: dict[str, Any] = {}
    if info.get("disable_radix_cache"):
        out["disable-radix-cache"] = True
    if info.get("chunked_prefill_size") not in (None, 8192):
        out["chunked-prefill-size"] = info["chunked_prefill_size"]
    if info.get("mm_processor_worker_num"):
        out["mm-processor-worker-num"] = info["mm_processor_worker_num"]
    return out


def _archive_trials() -> list[tuple[str, dict]]:
    """(server folder, trial) for every trial file in the two archives (trials/SERVER/WORKLOAD-sSEED.json)."""
    out = []
    for path in ARCHIVES:
        with tarfile.open(path) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                if m.isfile() and m.name.endswith(".json"):
                    doc = orjson.loads(tar.extractfile(m).read())  # type: ignore[union-attr]
                    out.append((Path(m.name).parent.name, doc))
    return out


def real_trials() -> tuple[list[dict], int]:
    """(the kept VALID trials as rows, how many INVALID ones were left out)."""
    rows, invalid = [], 0
    for server, t in _archive_trials():
        if not t["summary"].get("valid"):
            invalid += 1
            continue
        host = " (host A)" if server.endswith("hostA") else ""
        load = {k: t["load"][k] for k in ("concurrency", "warmup_requests", "seed")}
        rows.append({"trial_id": t["trial_id"], "experiment": experiment(t) + host,
                     "seed": t["workload"]["spec"]["seed"], "spec": t["workload"]["spec"],
                     "flags": modelled_flags(t["server"]["server_info"]), "load": load,
                     "requests": t["load"]["requests"], "summary": t["summary"]})
    return sorted(rows, key=lambda r: (r["experiment"], r["seed"])), invalid


@cache
def _requests(spec_json: bytes, n: int) -> list:
    spec = WorkloadSpec(**orjson.loads(spec_json)).model_copy(update={"tokenizer": None})  # the sim counts words
    return build_requests(spec, n).requests


def replay(trial: dict, model: str = MODEL, gpu: str = GPU) -> dict:
    """The simulator's summary of ``trial``'s workload, load and modelled flags on ``model`` / ``gpu``."""
    load = LoadConfig(**trial["load"])
    reqs = _requests(orjson.dumps(trial["spec"], option=orjson.OPT_SORT_KEYS), load.warmup_requests + trial["requests"])
    flags = {**SIM_FLAGS, **trial["flags"], "gpu-profile": gpu, "model-profile": model}
    return simulate(flags, reqs, load).summary.model_dump()


def _row(trial: dict, sim: dict) -> dict:
    real = {n: f(trial["summary"]) for n, f in FIGURES.items()}
    pred = {n: f(sim) for n, f in FIGURES.items()}
    return {"trial": {k: trial[k] for k in ("trial_id", "experiment", "seed", "flags")}, "real": real, "sim": pred,
            "err": {n: pred[n] / real[n] - 1 for n in FIGURES}, "sim_valid": sim["valid"]}


def _replay_row(args: tuple[dict, str, str]) -> dict:
    trial, model, gpu = args
    return _row(trial, replay(trial, model, gpu))


def compare(trials: Sequence[dict], model: str = MODEL, gpu: str = GPU, jobs: int = 1) -> list[dict]:
    """Per trial: real and predicted figures and the signed relative errors (``jobs`` > 1: forked workers)."""
    work = [(t, model, gpu) for t in trials]
    if jobs <= 1:
        return [_replay_row(w) for w in work]
    from multiprocessing import get_context

    with get_context("fork").Pool(jobs) as pool:
        return pool.map(_replay_row, work)


def median_abs(rows: Sequence[dict], figure: str) -> float | None:
    errs = [abs(r["err"][figure]) for r in rows]
    return statistics.median(errs) if errs else None


def report(rows: Sequence[dict]) -> str:
    """Markdown: every trial, then the median |error| held out / fitted on, per experiment and overall."""
    names = list(FIGURES)
    lines = ["| experiment | seed | " + " | ".join(f"{n} real / sim (error)" for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = [f"{r['real'][n]:,.1f} / {r['sim'][n]:,.1f} ({r['err'][n]:+.0%})" for n in names]
        lines.append(f"| {r['trial']['experiment']} | {r['trial']['seed']} | " + " | ".join(cells) + " |")
    held = [r for r in rows if r["trial"]["seed"] != 1]
    groups = [(f"{e}, held out", [r for r in held if r["trial"]["experiment"] == e])
              for e in dict.fromkeys(r["trial"]["experiment"] for r in held)]
    fitted = [r for r in rows if r["trial"]["seed"] == 1]
    groups += [("**all held out (seeds 2-3)**", held), ("fitted on (seed 1)", fitted)]
    lines += ["", "| median \\|error\\| | trials | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for label, sel in groups:
        lines.append(f"| {label} | {len(sel)} | " + " | ".join(_pct(median_abs(sel, n)) for n in names) + " |")
    verdicts = [f"{n} {_pct(m)} {'<=' if m <= t else '>'} {t:.0%}" for n, t in TARGETS.items()
                if (m := median_abs(held, n)) is not None]
    return "\n".join([*lines, "", "Held out against issue 30's targets: " + "; ".join(verdicts)])


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


# --- the fit ----------------------------------------------------------------------------------------------

PARAMS = ("image ms at auto W", "worker_contention", "vision ms_per_image", "host ms at auto W",
          "image ms per 1k tokens at auto W", "scheduler_contention")


def profile_fields(x: Sequence[float], base: dict) -> dict:
    """A fit vector -> the model profile's ``vision`` and ``front_end`` values. The image service and the host
    time are fitted at the auto worker count W (the trials' own) and stored per worker alone (/ W^exponent)."""
    s_auto, alpha, enc, host_auto, tok_auto, beta = (float(v) for v in x)
    w = base["front_end"].get("image_workers_auto", 2)
    mp = 896 * 896 / 1e6  # the one image size measured: fixed and per-megapixel parts are not told apart
    fe = {**base["front_end"], "image_ms": 0.0, "image_ms_per_megapixel": round(s_auto / w**alpha / mp, 3),
          "worker_contention": round(alpha, 4), "image_ms_per_1k_tokens": round(tok_auto / w**alpha, 3),
          "scheduler_contention": round(beta, 4)}
    vision = {**base["vision"], "ms_per_image": round(enc, 3), "host_ms_per_image": round(host_auto / w**beta, 3)}
    return {"vision": vision, "front_end": fe}


def fit_vector(base: dict) -> list[float]:
    fe, v = base["front_end"], base["vision"]
    w = fe.get("image_workers_auto", 2)
    a, b = fe.get("worker_contention", 0.0), fe.get("scheduler_contention", 0.0)
    return [fe.get("image_ms_per_megapixel", 0.0) * 896 * 896 / 1e6 * w**a, a, v.get("ms_per_image", 0.0),
            v.get("host_ms_per_image", 0.0) * w**b, fe.get("image_ms_per_1k_tokens", 0.0) * w**a, b]


def loss(rows: Sequence[dict]) -> float:
    """Mean |log(predicted / real)| over the fitted figures: robust, as the targets are medians of |error|."""
    return float(np.mean([sum(abs(math.log1p(r["err"][n])) for n in FITTED) for r in rows]))


def fit_vlm(trials: Sequence[dict], jobs: int, maxfev: int, log: Callable[[str], None]) -> tuple[dict, float]:
    """Nelder-Mead over the six front-end and vision parameters on ``trials`` (the seed-1 ones)."""
    from scipy.optimize import minimize

    path = MODEL_DIR / f"{MODEL}.yaml"
    base = yaml.safe_load(path.read_text())
    tmp = Path(tempfile.mkdtemp(prefix="vlm-fit-"))
    calls = itertools.count()

    def f(x: np.ndarray) -> float:
        if np.any(x < 0):
            return 1e9
        cand = {**base, **profile_fields(x, base)}
        p = tmp / f"cand-{next(calls)}.yaml"  # a new path per candidate: profiles are cached by path
        p.write_text(yaml.safe_dump(cand, sort_keys=False))
        value = loss(compare(trials, str(p), GPU, jobs))
        log(f"loss {value:.4f} at " + ", ".join(f"{n} {v:.3f}" for n, v in zip(PARAMS, x, strict=True)))
        return value

    x0 = np.asarray(fit_vector(base))
    simplex = [x0] + [x0 + np.eye(len(x0))[k] * np.maximum(0.25 * np.abs(x0[k]), 0.2) for k in range(len(x0))]
    res = minimize(f, x0, method="Nelder-Mead", options={"maxfev": maxfev, "xatol": 0.05, "fatol": 1e-3,
                                                         "initial_simplex": simplex})
    return profile_fields(res.x, base), float(res.fun)


def fit_text(log: Callable[[str], None]) -> float:
    """The text front end's fixed latency (ms) that best replays the open-loop TTFT p50 of the three text trials.

    Under open-loop arrivals a fixed latency shifts every request alike, so it adds to each TTFT exactly;
    minimised: the mean squared log error of TTFT p50 over the three rates."""
    from scipy.optimize import minimize_scalar

    svs = _sim_vs_sglang()
    trials, _ = svs.real_trials(["openloop"])
    rows = svs.compare(trials, [GPU], TEXT_MODEL)
    fe = load_model_profile(TEXT_MODEL).front_end.text_ms
    pairs = [(r["real"]["TTFT p50 ms"], r["sim"][GPU]["TTFT p50 ms"] - fe) for r in rows]  # the sim without it
    res = minimize_scalar(lambda c: sum(math.log((s + c) / real) ** 2 for real, s in pairs), bounds=(0, 200),
                          method="bounded")
    for real, s in pairs:
        log(f"open loop: TTFT p50 real {real:.1f} ms, simulated without the front end {s:.1f} ms")
    return float(res.x)


def _sim_vs_sglang():
    spec = importlib.util.spec_from_file_location("sim_vs_sglang", REPO / "bench" / "sim_vs_sglang.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def set_profile_values(path: Path, fields: dict[str, dict[str, Any]]) -> None:
    """Set ``fields`` ({section: {key: value}}) in the profile YAML at ``path``, keeping its comments and layout."""
    lines = path.read_text().splitlines()
    for section, values in fields.items():
        start = next((i for i, ln in enumerate(lines) if ln.startswith(f"{section}:")), None)
        if start is None:
            lines.append(f"{section}:")
            start = len(lines) - 1
        end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "#"))),
                   len(lines))
        for key, value in values.items():
            pat = re.compile(rf"^(\s+{re.escape(key)}:\s*)([^#\s]+)(.*)$")
            hit = next((i for i in range(start + 1, end) if pat.match(lines[i])), None)
            if hit is None:
                lines.insert(end, f"  {key}: {value}")
                end += 1
            else:
                lines[hit] = pat.sub(lambda m, v=value: f"{m.group(1)}{v}{m.group(3)}", lines[hit])
    path.write_text("\n".join(lines) + "\n")
    load_model_profile.cache_clear()


def predict_workers(trials: Sequence[dict], workers: Sequence[int], jobs: int) -> str:
    """The radix-on reuse-0.9 trials replayed at each ``--mm-processor-worker-num`` (measured: 2 and 8 only)."""
    base = [t for t in trials if t["experiment"] == "radix on, r90"]
    lines = ["| --mm-processor-worker-num | measured | req/s | TTFT p50 ms | TPOT p50 ms |", "|---|---|---|---|---|"]
    for w in workers:
        rows = compare([{**t, "flags": {**t["flags"], "mm-processor-worker-num": w}} for t in base], jobs=jobs)
        med = {n: statistics.median(r["sim"][n] for r in rows) for n in ("req/s", "TTFT p50 ms", "TPOT p50 ms")}
        lines.append(f"| {w} | {'yes' if w in (2, 8) else 'no'} | {med['req/s']:.2f} | {med['TTFT p50 ms']:,.0f} |"
                     f" {med['TPOT p50 ms']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="replay in this many forked processes")
    ap.add_argument("--fit", action="store_true", help="fit the VLM's front end and vision on the seed-1 trials")
    ap.add_argument("--fit-text", action="store_true", help="fit the text front end's latency on the open-loop trials")
    ap.add_argument("--maxfev", type=int, default=150, help="--fit: at most this many evaluations")
    ap.add_argument("--write", action="store_true", help="write the fitted values into the model profile(s)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure as JSON")
    ap.add_argument("--predict-workers", type=int, nargs="*", default=None,
                    help="also replay the radix-on r90 trials at these processor thread counts")
    args = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    trials, invalid = real_trials()
    for t in trials:  # build each workload once, before any fork
        _requests(orjson.dumps(t["spec"], option=orjson.OPT_SORT_KEYS), t["load"]["warmup_requests"] + t["requests"])
    if args.fit_text:
        ms = round(fit_text(log), 1)
        print(f"text front end: text_ms = {ms}")
        if args.write:
            for name in (TEXT_MODEL, MODEL):
                set_profile_values(MODEL_DIR / f"{name}.yaml", {"front_end": {"text_ms": ms}})
    if args.fit:
        fields, value = fit_vlm([t for t in trials if t["seed"] == 1], args.jobs, args.maxfev, log)
        print(f"fitted (loss {value:.4f}): {fields}")
        if args.write:
            set_profile_values(MODEL_DIR / f"{MODEL}.yaml", fields)
    rows = compare(trials, jobs=args.jobs)
    print(report(rows))
    print(f"\nINVALID trials left out: {invalid}")
    if args.predict_workers:
        print("\n" + predict_workers(trials, args.predict_workers, args.jobs))
    if args.json:
        args.json.write_bytes(orjson.dumps({"invalid": invalid, "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
