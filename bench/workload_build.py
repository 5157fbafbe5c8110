"""How fast the workload generator builds requests, per preset, with and without a tokenizer.

The baseline is chat-default without a tokenizer (one word per token) in the same run; the other
rows are stated as its multiple. With --tokenizer PATH a real model's tokenizer.json is used,
otherwise a byte-level BPE is trained on the Python stdlib as in tests/tokenizer_fixtures.py.

Usage: python bench/workload_build.py [--n 500] [--tokenizer /models/Qwen3-8B]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from servetune.workload import build_requests, get_preset, load_tokenizer  # noqa: E402


def _rate(spec, n, tok) -> tuple[float, float]:
    t = time.perf_counter()
    batch = build_requests(spec, n, tok)
    dt = time.perf_counter() - t
    tokens = sum(r.input_tokens for r in batch.requests)
    return n / dt, tokens / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--tokenizer")
    a = ap.parse_args()
    if a.tokenizer:
        tok = load_tokenizer(a.tokenizer)
    else:
        from tokenizer_fixtures import train_tokenizer

        tok = load_tokenizer(train_tokenizer(Path(tempfile.mkdtemp()) / "stdlib-bpe"))
    _rate(get_preset("chat-default"), 50, tok)  # warm-up: imports, first-call costs
    base, _ = _rate(get_preset("chat-default"), a.n, None)
    print(f"baseline chat-default, no tokenizer: {base:.0f} req/s ({a.n} requests)")
    for name, n in (("chat-default", a.n), ("shared-prefix-heavy", a.n), ("multi-turn-chat", a.n),
                    ("long-context", max(a.n // 10, 10)), ("vlm-chat", max(a.n // 5, 10))):  # fmt: skip
        for label, t in (("no tokenizer", None), (f"tokenizer {tok.name}", tok)):
            rps, tps = _rate(get_preset(name), n, t)
            print(
                f"{name:20s} {label:26s} {rps:8.0f} req/s {tps / 1e6:6.2f} M prompt tok/s  x{rps / base:.2f}"
            )


if __name__ == "__main__":
    main()
