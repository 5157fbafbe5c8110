"""Tables of issue 30's VLM runs on real SGLang (scripts/gpu-h200-vlm.sh): the median over repeats per config.

    python scripts/gpu_h200_vlm_summary.py DIR [--json OUT.json]

DIR holds trials/<config>/<workload>-s<seed>.json (servetune bench results, as the device script's archive
unpacks). Per-request figures come from the measured (non-warm-up), successful records:
TPOT = (E2E - TTFT) / (completion tokens - 1); max ITL = the longest gap between two streamed chunks (the
archive adds it per record before dropping the chunk arrays); image tokens of a request = its usage
prompt_tokens - its text tokens (exact: the workload is measured with the model's tokenizer) - the chat
template's overhead (the median of prompt_tokens - text tokens over the text-only requests of the trial).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

CONFIG_LABEL = {"on": "radix on, chunk 8192 (default)", "off": "radix off (--disable-radix-cache)",
                "chunk1k": "--chunked-prefill-size 1024", "mixed": "chunk 1024 + --enable-mixed-chunk"}
RADIX = (("vlm-radix-r90", "0.9"), ("vlm-radix-r50", "0.5"))


def config_label(cfg: str) -> str:
    if cfg.startswith("mmw") and cfg[3:].isdigit():
        return f"radix on, --mm-processor-worker-num {cfg[3:]}"
    return CONFIG_LABEL.get(cfg, cfg)


def radix_configs(data: dict) -> list[str]:
    """on, off, then the mmwN configs (SGLang's multimodal processor threads), in that order."""
    mmw = sorted((c for c in data if c.startswith("mmw") and c[3:].isdigit()), key=lambda c: int(c[3:]))
    return [c for c in ("on", "off") if c in data] + mmw


def radix_cells(data: dict):
    """(reuse, config, trials by seed) of the radix experiment, in table order, cells with trials only."""
    for w, reuse in RADIX:
        for cfg in radix_configs(data):
            t = data.get(cfg, {}).get(w)
            if t:
                yield reuse, cfg, t


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def trial_figures(d: dict) -> dict:
    s = d["summary"]
    recs = [r for r in d["records"] if not r.get("warmup") and r.get("http_status") == 200 and not r.get("error_class")]
    text = [r for r in recs if r["n_images"] == 0]
    img = [r for r in recs if r["n_images"] > 0]
    # an image request "hit" when at least half its prompt came from the radix cache (its image's KV reused)
    img_hit = [r for r in img if (r.get("cached_tokens") or 0) >= 0.5 * (r.get("prompt_tokens") or 1)]
    img_miss = [r for r in img if r not in img_hit]
    overhead = statistics.median([r["prompt_tokens"] - r["requested_input_tokens"] for r in text]) if text else None

    def tpot(r):
        n = r.get("completion_tokens") or 0
        return (r["e2e_ms"] - r["ttft_ms"]) / (n - 1) if n > 1 and r.get("ttft_ms") is not None else None

    def group(rs):
        tt = [r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None]
        tp = [x for x in map(tpot, rs) if x is not None]
        mi = [r["max_itl_ms"] for r in rs if r.get("max_itl_ms") is not None]
        return {"n": len(rs), "ttft_p50": pct(tt, 50), "ttft_p99": pct(tt, 99), "tpot_p50": pct(tp, 50),
                "tpot_p99": pct(tp, 99), "max_itl_p50": pct(mi, 50), "max_itl_p99": pct(mi, 99)}

    prompt = sum(r["prompt_tokens"] or 0 for r in recs)
    cached = sum(r["cached_tokens"] or 0 for r in recs)
    img_tok = [r["prompt_tokens"] - r["requested_input_tokens"] - overhead for r in img] if overhead is not None else []
    text_tok_total = sum(r["requested_input_tokens"] for r in recs)
    gpu = d.get("gpu") or {}
    samples = [x["mem_used"] for x in gpu.get("samples") or [] if x.get("mem_used") is not None]
    info = ((d.get("server") or {}).get("server_info") or {})
    return {
        "status": d["status"], "valid": s.get("valid"), "invalid_reasons": s.get("invalid_reasons"),
        "requests_ok": s.get("requests_ok"), "requests_failed": s.get("requests_failed"),
        "errors_by_class": s.get("errors_by_class"),
        "req_s": s.get("request_throughput"), "out_tok_s": s.get("output_tokens_per_s"),
        "in_tok_s": s.get("input_tokens_per_s"), "goodput_rps": s.get("goodput_rps"),
        "goodput_fraction": s.get("goodput_fraction"),
        "ttft_p50": (s.get("ttft_ms") or {}).get("p50"), "ttft_p99": (s.get("ttft_ms") or {}).get("p99"),
        "tpot_p50": (s.get("tpot_ms") or {}).get("p50"), "tpot_p99": (s.get("tpot_ms") or {}).get("p99"),
        "e2e_p99": (s.get("e2e_ms") or {}).get("p99"), "itl_p99": (s.get("itl_ms") or {}).get("p99"),
        "hit_rate_usage": s.get("prefix_hit_rate"), "hit_rate_server": s.get("prefix_hit_rate_server"),
        "hit_rate_records": cached / prompt if prompt else None,
        "prompt_tokens_mean": prompt / len(recs) if recs else None,
        "cached_tokens_mean": cached / len(recs) if recs else None,
        "template_overhead_tokens": overhead,
        "image_tokens_per_image_request_p50": pct(img_tok, 50),
        "image_token_share": (sum(img_tok) / prompt) if prompt and img_tok else 0.0,
        "text_token_share_check": text_tok_total / prompt if prompt else None,
        "text": group(text), "image": group(img), "image_hit": group(img_hit), "image_miss": group(img_miss),
        "server_running_mean": s.get("server_running_reqs_mean"), "server_queue_mean": s.get("server_queue_reqs_mean"),
        "throughput_mismatch": s.get("throughput_mismatch"), "completions_in_window": s.get("completions_in_window"),
        "in_flight_mean": s.get("in_flight_mean"), "client_lag_p99_ms": s.get("client_lag_p99_ms"),
        "requests_measured": s.get("requests_measured"),
        "gpu_mem_peak_gib": s.get("gpu_mem_peak_bytes") / 2**30 if s.get("gpu_mem_peak_bytes") else None,
        "gpu_mem_total_gib": s.get("gpu_mem_total_bytes") / 2**30 if s.get("gpu_mem_total_bytes") else None,
        "gpu_mem_min_gib": min(samples) / 2**30 if samples else None,
        "gpu_mem_mean_gib": s.get("gpu_mem_mean_bytes") / 2**30 if s.get("gpu_mem_mean_bytes") else None,
        "gpu_util_mean": s.get("gpu_util_mean"),
        "server_token_usage_max": s.get("server_token_usage_max"),
        "chunked_prefill_size": info.get("chunked_prefill_size"),
        "disable_radix_cache": info.get("disable_radix_cache"),
        "window_s": s.get("window_s"),
    }


def load(root: Path) -> dict:
    out: dict = defaultdict(lambda: defaultdict(dict))
    for p in sorted(root.glob("trials/*/*-s*.json")):
        cfg = p.parent.name
        name, _, seed = p.stem.rpartition("-s")
        out[cfg][name][int(seed)] = trial_figures(json.loads(p.read_text()))
    return out


def med(trials: dict, key: str, sub: str | None = None) -> float | None:
    xs = [(t[sub] if sub else t).get(key) for t in trials.values()]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rng(trials: dict, key: str, sub: str | None = None) -> tuple[float, float] | None:
    xs = [(t[sub] if sub else t).get(key) for t in trials.values()]
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else None


def f(x, nd=0, pctg=False):
    if x is None:
        return "-"
    return f"{100 * x:.{nd}f}%" if pctg else f"{x:,.{nd}f}"


def fr(trials, key, sub=None, nd=0, pctg=False):
    """median [min-max] over repeats."""
    m, r = med(trials, key, sub), rng(trials, key, sub)
    if m is None:
        return "-"
    if len(trials) < 2 or r is None:
        return f(m, nd, pctg)
    return f"{f(m, nd, pctg)} [{f(r[0], nd, pctg)}-{f(r[1], nd, pctg)}]"


def ratio(a: dict, b: dict, key: str) -> str:
    """a / b of the medians, and the min-max of the per-seed ratios over the seeds both have."""
    ma, mb = med(a, key), med(b, key)
    if not ma or not mb:
        return "-"
    per = [a[s][key] / b[s][key] for s in a if s in b and a[s].get(key) and b[s].get(key)]
    out = f"{ma / mb:.2f}x"
    if len(per) > 1:
        out += f" (per seed {min(per):.2f}-{max(per):.2f}x)"
    return out


def tables(data: dict) -> str:
    lines: list[str] = []
    add = lines.append
    n_valid = sum(1 for c in data.values() for w in c.values() for t in w.values() if t["valid"])
    n_all = sum(1 for c in data.values() for w in c.values() for t in w.values())
    add(f"Trials: {n_all} ({n_valid} valid by servetune's steady-window rules). Figures: median over repeats"
        " (workload seeds) [min-max].\n")

    add("### (a) Radix cache on vs off (and SGLang's multimodal processor threads), image-heavy mix with repeated"
        " images (closed loop 64)\n")
    add("| reuse | server | seeds | valid | req/s | output tok/s | goodput req/s (TTFT<=2 s, TPOT<=40 ms) | TTFT p50 ms"
        " | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | prefix hit rate (usage) | image-token share |")
    add("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for reuse, cfg, t in radix_cells(data):
        nv = sum(1 for x in t.values() if x["valid"])
        add(f"| {reuse} | {config_label(cfg)} | {','.join(map(str, sorted(t)))} | {nv}/{len(t)} | {fr(t, 'req_s', nd=2)}"
            f" | {fr(t, 'out_tok_s')} | {fr(t, 'goodput_rps', nd=2)}"
            f" | {fr(t, 'ttft_p50')} | {fr(t, 'ttft_p99')} | {fr(t, 'tpot_p50', nd=1)} | {fr(t, 'tpot_p99', nd=1)}"
            f" | {fr(t, 'hit_rate_usage', nd=1, pctg=True)} | {f(med(t, 'image_token_share'), 0, True)} |")
    add("")
    for w, reuse in RADIX:
        on = data.get("on", {}).get(w)
        for cfg in radix_configs(data):
            other = data.get(cfg, {}).get(w)
            if cfg == "on" or not on or not other:
                continue
            add(f"reuse {reuse}, on / {cfg}: " + ", ".join(
                f"{lab} {ratio(on, other, key)}" for lab, key in
                (("req/s", "req_s"), ("goodput", "goodput_rps"), ("TTFT p50 on/other", "ttft_p50"))) + "\n")

    add("Where the time goes (median over seeds [min-max]; `server_*` from SGLang's metrics, 1 s samples; an image"
        " request is a hit when >= 50% of its prompt was cached; all measured requests):\n")
    add("| reuse | server | GPU util mean % | running in the scheduler (of 64 in flight) | scheduler queue"
        " | TTFT p50 ms text-only | image hit | image miss | image hits / image requests |")
    add("|---|---|---|---|---|---|---|---|---|")
    for reuse, cfg, t in radix_cells(data):
        hits = med({k: {"x": v["image_hit"]["n"] / max(v["image"]["n"], 1)} for k, v in t.items()}, "x")
        add(f"| {reuse} | {cfg} | {fr(t, 'gpu_util_mean')} | {fr(t, 'server_running_mean')} | {fr(t, 'server_queue_mean', nd=1)}"
            f" | {fr(t, 'ttft_p50', 'text')} | {fr(t, 'ttft_p50', 'image_hit')} | {fr(t, 'ttft_p50', 'image_miss')}"
            f" | {f(hits, 0, True)} |")

    add("\nValidity per trial (servetune's rules; the token mismatch is |arrived / completed - 1|, limit 15%):\n")
    add("| server | workload | seed | valid | measured | window s | completions in window | token mismatch"
        " | in flight mean | client lag p99 ms |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for w, _reuse in RADIX:
        for cfg in radix_configs(data):
            for seed, x in sorted(data.get(cfg, {}).get(w, {}).items()):
                add(f"| {cfg} | {w} | {seed} | {'VALID' if x['valid'] else 'INVALID'} | {x['requests_measured']}"
                    f" | {f(x['window_s'], 1)} | {x['completions_in_window']} | {f(x['throughput_mismatch'], 1, True)}"
                    f" | {f(x['in_flight_mean'], 1)} | {f(x['client_lag_p99_ms'], 1)} |")

    if any(data.get(c, {}).get("vlm-scenario1") for c in data):  # only where the run has scenario 1
        add("\n### (b) Scenario 1: closed loop 64, 1 in 6 requests with four 896x896 images (4,096 image tokens)\n")
        add("| config | n | req/s | output tok/s | text TTFT p50 / p99 ms | text TPOT p50 / p99 ms | text max-ITL p50 / p99 ms"
            " | image-req TTFT p50 / p99 ms | image-req TPOT p50 ms | goodput req/s |")
        add("|---|---|---|---|---|---|---|---|---|---|")
        for cfg in ("on", "chunk1k", "mixed"):
            t = data.get(cfg, {}).get("vlm-scenario1")
            if not t:
                continue
            add(f"| {config_label(cfg)} | {len(t)} | {fr(t, 'req_s', nd=2)} | {fr(t, 'out_tok_s')}"
                f" | {fr(t, 'ttft_p50', 'text')} / {fr(t, 'ttft_p99', 'text')} | {fr(t, 'tpot_p50', 'text', 1)} / {fr(t, 'tpot_p99', 'text', 1)}"
                f" | {fr(t, 'max_itl_p50', 'text')} / {fr(t, 'max_itl_p99', 'text')}"
                f" | {fr(t, 'ttft_p50', 'image')} / {fr(t, 'ttft_p99', 'image')} | {fr(t, 'tpot_p50', 'image', 1)}"
                f" | {fr(t, 'goodput_rps', nd=2)} |")

    if any(data.get("on", {}).get(w) for w in ("vlm-position-text", "vlm-position-system")):
        add("\n### (c) Images before the shared system prompt vs after it (1,024-token system prompt, unique images)\n")
        add("| position | n | prefix hit rate (usage) | hit rate (server counters) | cached tokens / request | prompt tokens / request"
            " | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |")
        add("|---|---|---|---|---|---|---|---|---|---|---|")
        for w, pos in (("vlm-position-text", "before_text"), ("vlm-position-system", "before_system")):
            t = data.get("on", {}).get(w)
            if not t:
                continue
            add(f"| {pos} | {len(t)} | {fr(t, 'hit_rate_usage', nd=1, pctg=True)} | {fr(t, 'hit_rate_server', nd=1, pctg=True)}"
                f" | {fr(t, 'cached_tokens_mean')} | {fr(t, 'prompt_tokens_mean')} | {fr(t, 'req_s', nd=2)} | {fr(t, 'out_tok_s')}"
                f" | {fr(t, 'ttft_p50')} | {fr(t, 'ttft_p99')} | {fr(t, 'tpot_p50', nd=1)} |")

    totals = sorted({round(t["gpu_mem_total_gib"], 1) for ws in data.values() for ts in ws.values()
                     for t in ts.values() if t.get("gpu_mem_total_gib")})
    add(f"\n### (d) GPU memory during the trials (NVML, 100 ms samples; GiB of {' / '.join(map(str, totals)) or '?'})\n")
    add("| config | workload | n | lowest | mean | peak | peak - lowest | KV pool use max (server) | image tokens / image request |")
    add("|---|---|---|---|---|---|---|---|---|")
    for cfg, ws in data.items():
        for w, t in ws.items():
            lo, pk = med(t, "gpu_mem_min_gib"), med(t, "gpu_mem_peak_gib")
            add(f"| {cfg} | {w} | {len(t)} | {f(lo, 2)} | {f(med(t, 'gpu_mem_mean_gib'), 2)} | {f(pk, 2)}"
                f" | {f(pk - lo if lo is not None and pk is not None else None, 2)}"
                f" | {f(med(t, 'server_token_usage_max'), 1, True)} | {f(med(t, 'image_tokens_per_image_request_p50'))} |")

    bad = [(c, w, s, t["invalid_reasons"]) for c, ws in data.items() for w, ts in ws.items() for s, t in ts.items()
           if not t["valid"]]
    if bad:
        add("\nInvalid trials (kept, figures above include them):")
        for c, w, s, why in bad:
            add(f"- {c}/{w} seed {s}: {'; '.join(why or [])}")
    errs = [(c, w, s, t["errors_by_class"]) for c, ws in data.items() for w, ts in ws.items() for s, t in ts.items()
            if t["requests_failed"]]
    if errs:
        add("\nFailed requests:")
        for c, w, s, e in errs:
            add(f"- {c}/{w} seed {s}: {e}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--json", type=Path, help="also write every trial's figures here")
    a = ap.parse_args()
    data = load(a.root)
    print(tables(data))
    if a.json:
        a.json.write_text(json.dumps(data, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
