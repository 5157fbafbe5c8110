"""Issue 31's bad inputs, part of bench/bad_inputs.py's catalogue (kept here so that module stays small): a key
written twice, a boolean where a number belongs, inf or nan, and sizes past servetune's limits
(servetune.strict_yaml, servetune.numbers; docs/reliability.md, "Strict numbers and keys").
"""

from __future__ import annotations

from typing import Any

INF, NAN = float("inf"), float("nan")
S, W = "stages", "workload"
HEAD = "name: bad\nmodel: m\n"  # a plan's first lines, before the sections a case writes twice

#: (name, plan patch or raw text, words the message names): each runs ``servetune tune plan.yaml --dry-run``
PLAN: list[tuple[str, Any, tuple[str, ...]]] = [
    # a key given twice: one line, the file, the key's dotted path and both lines
    ("plan_duplicate_section", HEAD + "sla: {p99_ttft_ms: 500}\nsla: {p99_ttft_ms: 100}\n",
     ("plan.yaml", "duplicate key 'sla'", "line 4", "first at line 3")),
    ("plan_duplicate_nested_key", HEAD + "sla: {p99_ttft_ms: 500}\nstages:\n  ramp:\n    levels: [16, 32]\n"
     "    requests: 100\n    levels: [64]\n", ("plan.yaml", "duplicate key 'stages.ramp.levels'", "line 8", "line 6")),
    ("plan_duplicate_in_workload", HEAD + "sla: {p99_ttft_ms: 500}\nworkload:\n  input: {kind: fixed, value: 3,"
     " value: 4}\n", ("plan.yaml", "duplicate key 'workload.input.value'", "line 5")),
    # a boolean where an integer or a number belongs (pydantic would read true as 1)
    ("plan_baseline_concurrency_true", {S: {"baseline": {"concurrency": True}}},
     ("stages.baseline.concurrency", "not a boolean (true)")),
    ("plan_ramp_level_true", {S: {"ramp": {"levels": [16, True]}}}, ("stages.ramp.levels.1", "not a boolean")),
    ("plan_requests_false", {S: {"ramp": {"requests": False}}}, ("stages.ramp.requests", "not a boolean (false)")),
    ("sla_bound_true", {"sla": {"p99_ttft_ms": True}}, ("sla.p99_ttft_ms", "not a boolean")),
    ("workload_length_true", {W: {"input": {"kind": "fixed", "value": True}}}, ("workload.input.value", "boolean")),
    # inf or nan, as YAML's .inf/.nan or as text pydantic would read as a float
    ("plan_baseline_rate_inf", {"load": {"mode": "rate"}, S: {"baseline": {"rate": INF}, "ramp": {"levels": [2, 4]}}},
     ("stages.baseline.rate", "finite")),
    ("plan_ramp_level_nan", {S: {"ramp": {"levels": [16, NAN]}}}, ("stages.ramp.levels.1", "finite")),
    ("sla_bound_inf_text", {"sla": {"p99_ttft_ms": "inf"}}, ("sla.p99_ttft_ms", "finite")),
    ("sla_error_rate_nan", {"sla": {"max_error_rate": "nan"}}, ("sla.max_error_rate", "finite")),
    ("budget_minutes_inf", {"budget": {"max_gpu_minutes": INF}}, ("budget.max_gpu_minutes", "finite")),
    # sizes past servetune's limits (100000 streams or requests/s, 10000000 requests a trial)
    ("plan_concurrency_1e9", {S: {"baseline": {"concurrency": 10**9}}}, ("stages.baseline.concurrency", "100000")),
    ("plan_ramp_level_1e9", {S: {"ramp": {"levels": [16, 10**9]}}}, ("stages.ramp.levels.1", "100000")),
    ("plan_requests_1e12", {S: {"ramp": {"requests": 10**12}}}, ("stages.ramp.requests", "10000000")),
    ("plan_max_in_flight_1e9", {"load": {"mode": "rate", "max_in_flight": 10**9}, S: {"ramp": {"levels": [4, 8]}}},
     ("load.max_in_flight", "100000")),
]
FILE_LEVEL = {name for name, raw, _ in PLAN if isinstance(raw, str)}  # one line: the file cannot be read

#: (name, bench options over the catalogue's defaults, words the message names, files)
BENCH: list[tuple[str, list[str], tuple[str, ...], dict[str, str]]] = [
    ("bench_workload_duplicate_key", ["--workload", "w.yaml"], ("w.yaml", "duplicate key 'input'", "line 2"),
     {"w.yaml": "input: {kind: fixed, value: 3}\ninput: {kind: fixed, value: 4}\n"}),
    ("bench_workload_length_true", ["--workload", "w.yaml"], ("w.yaml", "input.value", "boolean"),
     {"w.yaml": "input: {kind: fixed, value: true}\n"}),
    ("bench_rate_inf", ["--rate", "inf"], ("--rate", "finite", "inf"), {}),
    ("bench_rate_nan", ["--rate", "nan"], ("--rate", "finite", "nan"), {}),
    ("bench_timeout_inf", ["--timeout-s", "inf"], ("--timeout-s", "finite"), {}),
    ("bench_sla_inf", ["--sla", "ttft_ms=inf"], ("--sla ttft_ms", "finite"), {}),
    ("bench_concurrency_1e9", ["--concurrency", "1000000000"], ("--concurrency", "100000"), {}),
    ("bench_requests_1e12", ["--requests", "1000000000000"], ("--requests", "10000000"), {}),
    ("bench_rate_1e9", ["--rate", "1e9"], ("--rate", "100000"), {}),
]
