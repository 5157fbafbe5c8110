"""servetune beside SGLang's own ``python -m sglang.bench_serving`` on the same server and workload shape.

Reads pairs of results at the same concurrency: a ``servetune bench`` result JSON and the JSONL line
``bench_serving --output-file`` appends (``generated-shared-prefix`` dataset, the shape of
plans/workloads/bench-serving-gsp.yaml). Prints one table per concurrency: each figure from both
tools, their ratio, and the definition that accounts for the difference (docs/metrics.md,
"servetune beside sglang.bench_serving"). Where bench_serving kept per-request details
(``--output-details``: ttfts, itls, output_lens) it also recomputes servetune's definitions from
bench_serving's own timestamps, so a gap left after that is measurement, not definition.

    python bench/bench_serving_side_by_side.py --pair 64 servetune-c64.json bench-serving-c64.jsonl [...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import orjson

# (label, servetune summary getter, bench_serving key, the definitions that differ)
FIGURES = (
    ("request throughput req/s", lambda s: s["request_throughput"], "request_throughput",
     "servetune: the measured requests completed in the steady window / its length; bench_serving: all "
     "completed / the whole run, ramp-up and drain included"),
    ("output tok/s", lambda s: s["output_tokens_per_s"], "output_throughput",
     "same spans as above; both count the server's usage tokens"),
    ("TTFT median ms", lambda s: s["ttft_ms"]["p50"], "median_ttft_ms",
     "both: send -> first chunk with text; servetune over the window's set, bench_serving over every request"),
    ("TTFT p99 ms", lambda s: s["ttft_ms"]["p99"], "p99_ttft_ms",
     "as above: the start-up wave (every stream's first prefill at once) is in bench_serving's set only"),
    ("TPOT median ms", lambda s: s["tpot_ms"]["p50"], "median_tpot_ms",
     "both (E2E - TTFT) / (output tokens - 1) per request"),
    ("TPOT p99 ms", lambda s: s["tpot_ms"]["p99"], "p99_tpot_ms", "as above"),
    ("ITL median ms", lambda s: s["itl_ms"]["p50"], "median_itl_ms",
     "servetune: a chunk of k tokens gives k gaps of gap/k; bench_serving (OpenAI path): one gap per chunk"),
    ("ITL p99 ms", lambda s: s["itl_ms"]["p99"], "p99_itl_ms", "as above"),
    ("E2E median ms", lambda s: s["e2e_ms"]["p50"], "median_e2e_latency_ms", "both send -> end of stream"),
)


def read_bench_serving(path: Path) -> dict:
    """The last result line of a bench_serving output file (it appends one line per run)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if not lines:
        raise SystemExit(f"{path}: no bench_serving result line")
    return json.loads(lines[-1])  # not orjson: bench_serving writes request_rate inf as a bare Infinity


def per_token_itl(bs: dict) -> list[float] | None:
    """bench_serving's per-chunk gaps re-read with servetune's rule (k gaps of gap/k for a k-token chunk),
    where its details hold them; the chunk sizes are not kept, so a chunk's k is its share of the
    request's output tokens over its chunk count (exact when every chunk carries one token)."""
    itls, lens = bs.get("itls"), bs.get("output_lens")
    if not itls or not lens:
        return None
    out: list[float] = []
    for gaps, n in zip(itls, lens, strict=False):
        if not gaps or not n or n < 2:
            continue
        k = (n - 1) / len(gaps)
        out += [1000 * g / k for g in gaps]
    return out


def table(level: int, st: dict, bs: dict) -> list[str]:
    s = st["summary"]
    rows = [f"### concurrency {level}", "",
            f"servetune: {s['requests_measured']} measured requests, steady window {s['window_s']:.1f} s, "
            f"valid={s['valid']}; bench_serving: {bs['completed']} completed in {bs['duration']:.1f} s",
            "", "| figure | servetune | bench_serving | ratio | why they differ |", "|---|---|---|---|---|"]
    for label, get, key, why in FIGURES:
        a, b = get(s), bs.get(key)
        ratio = f"{a / b:.3f}" if a and b else "-"
        rows.append(f"| {label} | {a:.2f} | {b:.2f} | {ratio} | {why} |" if a is not None and b is not None
                    else f"| {label} | {a} | {b} | - | {why} |")
    itl = per_token_itl(bs)
    if itl:
        rows.append(f"| ITL median ms, bench_serving's gaps by servetune's rule | {s['itl_ms']['p50']:.2f} | "
                    f"{float(np.median(itl)):.2f} | {s['itl_ms']['p50'] / float(np.median(itl)):.3f} | "
                    "the definition removed: what is left is measurement |")
    return rows + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", nargs=3, action="append", metavar=("LEVEL", "SERVETUNE_JSON", "BENCH_SERVING_JSONL"),
                    required=True)
    args = ap.parse_args()
    for level, st_path, bs_path in args.pair:
        st = orjson.loads(Path(st_path).read_bytes())
        print("\n".join(table(int(level), st, read_bench_serving(Path(bs_path)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
