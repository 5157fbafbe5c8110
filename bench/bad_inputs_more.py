"""More of issue 31's bad inputs, part of bench/bad_inputs.py's catalogue (kept here so that module stays small):
a server URL with a path, query string or fragment (servetune.loadgen.config.http_base_url), options a dry run
did not check (``tune --dry-run --trigger/--previous``), an SGLang version with no catalogue (``serve``), and an
invalid environment variable name in ``engine.env`` (servetune.engines.common.env_name); docs/reliability.md,
"URLs, dry-run options, versions and env names".
"""

from __future__ import annotations

from typing import Any

SECRET = "Sup3rS3cret-pw"  # the catalogue's planted secret (bench/bad_inputs.py): never to be printed
BASE = "give the server's base URL"
ENV = "not a valid environment variable name"
EXTERNAL = {"engine": {"kind": "external", "url": "http://127.0.0.1:9/v1"}, "stages": {"refine": {"enabled": False}}}

#: (name, plan patch, words the message names): each runs ``servetune tune plan.yaml --dry-run``
PLAN: list[tuple[str, Any, tuple[str, ...]]] = [
    ("plan_external_url_path", EXTERNAL, ("engine.external.url", "a path", BASE)),
    ("plan_env_leading_digit", {"engine": {"env": {"1BAD": "x"}}}, ("engine.sglang.env.1BAD", ENV)),
    ("plan_env_dash", {"engine": {"env": {"A-B": SECRET}}}, ("engine.sglang.env.A-B", ENV)),
    ("plan_env_equals", {"engine": {"env": {"A=B": "x"}}}, ("engine.sglang.env.A=B", ENV)),
    ("plan_env_empty_name", {"engine": {"env": {"": "x"}}}, ("engine.sglang.env.''", ENV, "empty")),
]

#: (name, bench options over the catalogue's defaults, words the message names, files)
BENCH: list[tuple[str, list[str], tuple[str, ...], dict[str, str]]] = [
    ("bench_url_path_v1", ["--url", "http://127.0.0.1:9/v1"], ("--url", "a path", BASE, "/v1/chat/completions"), {}),
    ("bench_url_endpoint_path", ["--url", "http://127.0.0.1:9/v1/chat/completions"], ("--url", "a path"), {}),
    ("bench_url_query", ["--url", f"http://127.0.0.1:9/?api_key={SECRET}"], ("--url", "a query string", BASE), {}),
    ("bench_url_fragment", ["--url", "http://127.0.0.1:9#top"], ("--url", "a fragment"), {}),
    ("bench_url_path_password", ["--url", f"http://u:{SECRET}@127.0.0.1:9/v1"], ("--url", "a path", "u:***@"), {}),
]

SIM = "name: bad\nmodel: m\nsla: {p99_ttft_ms: 500}\nengine: {kind: sim}\nstages: {refine: {enabled: false}}\n"
#: (name, argv after ``servetune``, words the message names, files): options a dry run used to let through
TUNE = [(name, ["tune", "plan.yaml", "--dry-run", *argv], expect, {"plan.yaml": SIM, **files})
        for name, argv, expect, files in [
            ("tune_dry_run_trigger_unknown", ["--trigger", "bogus"], ("--trigger", "bogus", "manual"), {}),
            ("tune_dry_run_previous_missing", ["--previous", "nope.json"], ("--previous", "nope.json"), {}),
            ("tune_dry_run_previous_corrupt", ["--previous", "p.json"], ("--previous", "p.json"), {"p.json": "{x"}),
            ("tune_dry_run_previous_not_recommendation", ["--previous", "p.json"],
             ("--previous", "p.json", "not a recommendation.json"), {"p.json": "[1, 2]"}),
        ]]

#: (name, extra ``serve --engine sglang --model m --dry-run`` options, words the message names)
SERVE: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("serve_sglang_version_banana", ["--sglang-version", "banana"], ("--sglang-version", "banana", "0.5.23")),
    ("serve_sglang_version_future", ["--sglang-version", "9.9.9"], ("--sglang-version", "9.9.9", "catalogued")),
    ("serve_sglang_version_empty", ["--sglang-version", ""], ("--sglang-version", "catalogued")),
]
#: ``servetune serve --engine external``: the same URL check as bench's
OTHER = [("serve_external_url_path", ["serve", "--engine", "external", "--url", "http://127.0.0.1:9/v1", "--dry-run"],
          ("--url", "a path", BASE), {})]
