"""Where a server start went, read from SGLang's own log: the kept start of SGLang 0.5.17 on an H100 (an 8B
Llama, 2026-12-07), the older capture line, a start that never served, and the report's sentence."""

from __future__ import annotations

from pathlib import Path

from servetune.telemetry import startup_log

KEPT = Path(__file__).parent / "data" / "gpu-h100-campaigns" / "2026-12-07b" / "sglang-start.log"


def test_the_kept_h100_start_splits_into_its_phases() -> None:
    phases = startup_log.read(KEPT)
    # 08:49:06 first line, weights 08:49:30-32, pool 08:49:33, captures end 08:50:43, fired up 08:50:54
    assert phases == {"logged_s": 108.0, "before_weights_s": 24.0, "weights_s": 2.03, "kv_cache_s": 1.0,
                      "cuda_graphs_s": 69.74, "prefill_graphs_s": 65.4, "decode_graphs_s": 4.34, "to_ready_s": 11.0}
    assert startup_log.summary(phases) == ("108 s logged: CUDA graphs 69.7 s (prefill 65.4), weights 2.0 s, "
                                           "KV cache 1 s, before the weights 24 s, to ready 11 s")


def test_older_capture_lines_and_a_start_that_never_served() -> None:
    lines = ["[2025-06-01 10:00:00] server_args=ServerArgs(...)",
             "[2025-06-01 10:00:05 TP0] Load weight begin. avail mem=78.00 GB",
             "[2025-06-01 10:00:20 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63 GB",
             "[2025-06-01 10:00:21 TP0] Memory pool end. avail mem=10 GB",
             "[2025-06-01 10:00:35 TP0] Capture cuda graph end. Time elapsed: 13.71 s. mem usage=1.2 GB.",
             "[2025-06-01 10:00:40] The server is fired up and ready to roll!"]
    phases = startup_log.parse(lines)
    assert phases == {"logged_s": 40.0, "before_weights_s": 5.0, "kv_cache_s": 1.0, "cuda_graphs_s": 13.71,
                      "to_ready_s": 5.0}  # no elapsed figure on this weight line: no weights_s
    assert startup_log.parse(lines[:-1]) is None  # never served: no phases to charge
    assert startup_log.parse(["no timestamps here", "The server is fired up and ready to roll!"]) is None
    assert startup_log.read(None) is None and startup_log.read(KEPT.with_name("absent.log")) is None
    assert startup_log.summary({"logged_s": "x"}) == "" and startup_log.summary({"logged_s": 3}) == "3 s logged"
