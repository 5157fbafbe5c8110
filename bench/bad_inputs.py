"""A runnable catalogue of bad inputs: every command a user runs, fed what users get wrong.

Why: issue 14 asks that every bad input gets one clear line (naming the field, flag or path and what is
wrong), the right exit code, no traceback, no secret. Each case runs as ``python -m servetune ...`` in a
temp dir (loopback only, no GPU; ``{db}``: a fresh, migrated database on a real Postgres); the table printed
is docs/reliability.md's. tests/test_reliability_inputs.py runs them in-process. ``bench/bad_inputs.py [CASE...]``
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson
import yaml

import bad_inputs_boundary as boundary  # issue 44's addresses, warehouse schemas and OS errors at a path
import bad_inputs_bounded as bounded  # issue 44's names and sizes
import bad_inputs_more as more  # issue 31's URL, dry-run, version and env-name cases
import bad_inputs_strict as strict  # issue 31's cases, beside this file

SECRET = "Sup3rS3cret-pw"  # planted in URLs, env values and flags: never to be printed
TRACEBACK = "Traceback (most recent call last)"
#: not part of an error: log records, and the progress bar bench draws before it finds the target down
NOISE = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|^bench\s.*\d+/\d+.*tok/s")
DROP = object()  # a plan patch value that removes the key


@dataclass(frozen=True)
class Case:
    """A bad input: argv after ``servetune``, files written first, the words its message holds; ``lines``: a
    plan's message is a header naming the file and one line per bad field; ``known``: an xfail, why, whose fix."""

    name: str
    argv: list[str]
    expect: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    code: int = 2
    lines: int = 1
    known: str | None = None


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    def message(self) -> list[str]:
        """The error line(s): stderr but log records, progress and blank lines (stdout if stderr is silent)."""
        lines = [ln.rstrip() for ln in self.stderr.splitlines() if ln.strip() and not NOISE.match(ln)]
        return lines or [ln.rstrip() for ln in self.stdout.splitlines() if ln.strip()]


def problems(case: Case, out: Outcome) -> list[str]:
    """What is wrong with how ``case`` was answered; empty when it got its clear line(s)."""
    lines, everything = out.message(), out.stdout + out.stderr
    missing = [w for w in case.expect if w.lower() not in " ".join(lines).lower()]
    checks = [(out.code != case.code, f"exit {out.code}, expected {case.code}"), (TRACEBACK in everything, "traceback"),
              (len(lines) != case.lines, f"{len(lines)} lines, expected {case.lines}"),
              (bool(missing), f"does not name {', '.join(map(repr, missing))}"), (SECRET in everything, "secret shown")]
    return [why for failed, why in checks if failed]


# --- fixtures: a valid plan and a valid trial result, each broken one way per case ---

PLAN = {"name": "bad", "model": "m", "sla": {"p99_ttft_ms": 500}}  # the sglang engine, default stages
SIM_PLAN = {**PLAN, "engine": {"kind": "sim"}, "stages": {"refine": {"enabled": False}}}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in copy.deepcopy(base).items() if patch.get(k) is not DROP}
    for k, v in patch.items():
        if v is not DROP:
            out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def plan(patch: dict[str, Any] | None = None, base: dict[str, Any] = PLAN) -> str:
    return yaml.safe_dump(_merge(base, patch or {}), sort_keys=False)


@cache
def _good_trial() -> dict[str, Any]:
    """A small real result (the simulator in virtual time), as ``servetune bench`` writes one."""
    from servetune.loadgen import LoadConfig
    from servetune.sim.virtual import simulate
    from servetune.workload import build_requests
    from servetune.workload.spec import WorkloadSpec

    fixed = {"kind": "fixed", "value": 32}
    spec = WorkloadSpec.model_validate({"input": fixed, "output": {**fixed, "value": 8}})
    load = LoadConfig(mode="concurrency", concurrency=2, warmup_requests=1)
    return simulate({}, build_requests(spec, 6).requests, load).to_dict()


def trial(edit: Callable[[dict[str, Any]], Any] = lambda d: None) -> str:
    data = copy.deepcopy(_good_trial())
    edit(data)
    return orjson.dumps(data).decode()


def drop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def put(path: str, value: Any) -> Callable[[dict], None]:
    def edit(d: Any) -> None:
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[last] = value
    return edit


@cache
def closed_port() -> int:  # a loopback port nobody listens on (bound, then released)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (name, plan patch or raw text, words the message names); each runs `servetune tune plan.yaml --dry-run`
S, E, W = "stages", "engine", "workload"
PLAN_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("plan_bad_yaml", "name: [unclosed\n", ("YAML", "line 2")),
    ("plan_not_utf8", b"name: \xff\xfe\n", ("UTF-8",)),
    ("plan_empty", "", ("empty",)),
    ("plan_a_list", "- name: x\n", ("mapping", "list")),
    ("plan_missing_sla", {"sla": DROP}, ("sla", "required")),
    ("plan_unknown_field", {"stagess": {}}, ("stagess", "extra")),
    ("plan_unknown_nested_field", {S: {"ramp": {"levles": [16]}}}, ("stages.ramp.levles",)),
    ("plan_name_wrong_type", {"name": [1, 2]}, ("name", "string")),
    ("plan_levels_not_a_list", {S: {"ramp": {"levels": "16,32"}}}, ("stages.ramp.levels", "list")),
    ("plan_levels_decreasing", {S: {"ramp": {"levels": [64, 32]}}}, ("stages.ramp.levels", "increasing")),
    ("plan_levels_negative", {S: {"ramp": {"levels": [-8, 16]}}}, ("stages.ramp.levels", "positive")),
    ("plan_ramp_below_baseline", {S: {"baseline": {"concurrency": 32}}}, ("ramp.levels", "baseline")),
    ("stage_ramp_requests_0", {S: {"ramp": {"requests": 0}}}, ("stages.ramp.requests", "1")),
    ("stage_baseline_concurrency_0", {S: {"baseline": {"concurrency": 0}}}, ("stages.baseline.concurrency",)),
    ("stage_correctness_100", {S: {"correctness": {"requests": 100}}}, ("stages.correctness.requests", "64")),
    ("refine_grid_no_values", {S: {"refine": {"grid": {"chunked-prefill-size": []}}}}, ("stages.refine.grid", "value")),
    ("refine_grid_dashes", {S: {"refine": {"grid": {"--chunked-prefill-size": [1024]}}}}, ("refine.grid", "dashes")),
    ("refine_grid_unknown_flag", {S: {"refine": {"grid": {"no-such-flag": [1]}}}}, ("refine.grid.no-such-flag",)),
    ("refine_grid_bad_value", {S: {"refine": {"grid": {"chunked-prefill-size": [2048, 0]}}}},
     ("chunked-prefill-size[1]", "bad value 0")),
    ("sla_no_p99_bound", {"sla": {"p99_ttft_ms": DROP, "max_error_rate": 0.1}}, ("sla", "p99_ttft_ms")),
    ("sla_negative", {"sla": {"p99_ttft_ms": -5}}, ("sla.p99_ttft_ms", "0")),
    ("sla_not_a_number", {"sla": {"p99_ttft_ms": "fast"}}, ("sla.p99_ttft_ms", "number")),
    ("validation_window_negative", {"validation": {"min_window_s": -1}}, ("validation.min_window_s",)),
    ("validation_waive_unknown", {"validation": {"waive": ["bogus"]}}, ("validation.waive", "gpu_memory_curve")),
    ("repeats_count_0", {"repeats": {"count": 0}}, ("repeats.count", "1")),
    ("repeats_max_below_count", {"repeats": {"count": 4, "max": 2}}, ("repeats", "max", "count")),
    ("budget_0", {"budget": {"max_gpu_minutes": 0}}, ("budget.max_gpu_minutes", "0")),
    ("on_failure_unknown", {"on_trial_failure": "retry"}, ("on_trial_failure", "continue")),
    ("endpoint_unknown", {"endpoint": "embeddings"}, ("endpoint", "chat")),
    ("engine_kind_unknown", {E: {"kind": "tgi"}}, ("engine", "tgi", "sglang")),
    ("engine_flag_unknown", {E: {"args": {"no-such-flag": 2}}}, ("engine", "--no-such-flag")),
    ("engine_flag_wrong_type", {E: {"args": {"max-running-requests": "lots"}}}, ("max-running-requests", "lots")),
    ("engine_chunked_prefill_0", {E: {"args": {"chunked-prefill-size": 0}}}, ("--chunked-prefill-size", "-1")),
    ("engine_mem_fraction_1_5", {E: {"args": {"mem-fraction-static": 1.5}}}, ("--mem-fraction-static", "1.5")),
    ("engine_conservativeness_negative", {E: {"args": {"schedule-conservativeness": -0.5}}},
     ("--schedule-conservativeness", ">= 0")),
    ("engine_external_no_url", {E: {"kind": "external"}}, ("engine.external.url", "required")),
    ("engine_secret_and_bad_field", {E: {"env": {"HF_TOKEN": SECRET}, "args": {"api-key": SECRET}},
                                     "budget": {"max_gpu_minutes": -1}}, ("budget.max_gpu_minutes",)),
    ("workload_median_negative", {W: {"input": {"kind": "lognormal", "median": -3, "sigma": 1}}},
     ("workload.input", "median")),
    ("workload_unknown_distribution", {W: {"input": {"kind": "zipf", "value": 3}}}, ("workload.input", "zipf")),
    ("workload_min_above_max", {W: {"output": {"kind": "uniform", "min": 64, "max": 8}}}, ("workload.output", "min")),
]
PLAN_CASES += strict.PLAN + more.PLAN + bounded.PLAN + boundary.PLAN  # issue 31: a key twice, a boolean, inf or nan,
# a size, a URL, env; issue 44: names as labels, grids and levels bounded
FILE_LEVEL = {"plan_bad_yaml", "plan_not_utf8", "plan_empty", "plan_a_list", *strict.FILE_LEVEL}  # no header


def _cases() -> list[Case]:
    p = closed_port()
    dead = f"postgresql://servetune:{SECRET}@127.0.0.1:{p}/servetune"
    bench = {"--url": f"http://127.0.0.1:{p}", "--concurrency": "2", "--requests": "2", "--out": "o.json"}
    good_plan, sim_plan = {"plan.yaml": plan()}, {"plan.yaml": plan(base=SIM_PLAN)}
    live, q, xid = ["--database-url", "{db}"], ["query", "ceiling_last_month"], "0123456789abcdef0123456789abcdef"
    t = ["tune", "plan.yaml"]  # with `plan.yaml` in the case's files

    def dbu(name: str, url: str, expect: tuple[str, ...]) -> Case:
        return Case(name, ["db", "upgrade" if "port" in name else "current", "--database-url", url], expect)

    def b(name: str, extra: list[str], expect: tuple[str, ...], files: dict | None = None) -> Case:
        opts = {**bench, **dict(zip(extra[::2], extra[1::2], strict=True))}  # a default given again is replaced
        return Case(name, ["bench", *(x for kv in opts.items() for x in kv)], expect, files or {})

    def res(name: str, cmd: str, text: str | bytes, expect: tuple[str, ...], *more: str) -> Case:
        argv = [cmd, "r.json", *more] + (["--database-url", "{db}"] if cmd == "load" else [])
        return Case(name, argv, expect, {"r.json": text})

    def serve(name: str, extra: list[str], expect: tuple[str, ...]) -> Case:
        return Case(name, ["serve", "--engine", "sglang", "--model", "m", "--dry-run", *extra], expect)

    return [Case(n, [*t, "--dry-run"], ("plan.yaml", *x), {"plan.yaml": raw if isinstance(raw, (str, bytes)) else
                 plan(raw)}, lines=1 if n in FILE_LEVEL else 2) for n, raw, x in PLAN_CASES] + [
        Case("plan_missing_file", ["tune", "nope.yaml", "--dry-run"], ("nope.yaml", "no such file")),
        Case("plan_is_a_folder", ["tune", ".", "--dry-run"], ("directory",)),
        Case("plan_missing_name_model_sla", [*t, "--dry-run"], ("plan.yaml", "name", "model", "sla"),
             {"plan.yaml": "stages: {}\n"}, lines=5),
        Case("tune_virtual_without_profile", [*t, "--virtual"], ("--virtual", "estimate"), good_plan),
        Case("tune_trigger_unknown", [*t, "--trigger", "hourly"], ("--trigger", "hourly"), sim_plan),
        Case("tune_previous_missing", [*t, "--previous", "nope.json"], ("--previous", "nope.json"), sim_plan),
        Case("tune_out_not_empty", [*t, "--out", "runs"], ("--out", "not an empty"), {**sim_plan, "runs/x": ""}),
        Case("tune_resume_without_out", [*t, "--resume"], ("--resume", "--out"), sim_plan),
        Case("tune_stop_after_0", [*t, "--stop-after", "0"], ("--stop-after",), good_plan),
        # --- bench ---
        Case("bench_no_url", ["bench", "--concurrency", "2", "--requests", "2"], ("--url",)),
        b("bench_url_scheme", ["--url", "ftp://x"], ("--url",)),
        b("bench_unreachable", [], ("unreachable", str(p), "no request was sent")),
        b("bench_url_password", ["--url", f"http://user:{SECRET}@127.0.0.1:{p}"], ("unreachable",)),
        b("bench_concurrency_negative", ["--concurrency", "-3"], ("--concurrency",)),
        b("bench_concurrency_text", ["--concurrency", "many"], ("--concurrency", "many")),
        b("bench_rate_negative", ["--rate", "-1"], ("--rate",)),
        b("bench_arrival_unknown", ["--arrival", "zipf", "--rate", "5"], ("--arrival",)),
        b("bench_endpoint_unknown", ["--endpoint", "embeddings"], ("--endpoint",)),
        b("bench_sla_unknown_key", ["--sla", "ttft=5"], ("--sla", "ttft")),
        b("bench_sla_not_a_number", ["--sla", "ttft_ms=fast"], ("--sla", "fast")),
        b("bench_sla_negative", ["--sla", "ttft_ms=-5"], ("--sla", "ttft_ms")),
        b("bench_sla_no_equals", ["--sla", "ttft_ms"], ("--sla", "key=value")),
        b("bench_workload_missing", ["--workload", "nope.yaml"], ("nope.yaml", "neither a file nor a preset")),
        b("bench_workload_bad_yaml", ["--workload", "w.yaml"], ("w.yaml", "YAML"), {"w.yaml": "input: [unclosed\n"}),
        b("bench_workload_unknown_field", ["--workload", "w.yaml"], ("w.yaml", "inputs"),
          {"w.yaml": "inputs: {kind: fixed, value: 3}\n"}),
        b("bench_gpus_bad", ["--gpus", "0,x"], ("--gpus", "0,x")),
        b("bench_server_log_missing", ["--server-log", "nope.log"], ("--server-log", "nope.log")),
        b("bench_tokenizer_missing", ["--tokenizer", "nope/tok.json"], ("tokenizer", "nope/tok.json")),
        b("bench_timeout_0", ["--timeout-s", "0"], ("--timeout-s",)),
        b("bench_unknown_option", ["--concurency", "4"], ("--concurency",)),
        *(b(*c) for c in strict.BENCH + more.BENCH + boundary.BENCH),
        *(Case(*c) for c in more.TUNE + more.OTHER + boundary.OTHER),
        # --- validate and load: broken result files (load against a real, migrated database) ---
        Case("validate_no_such_file", ["validate", "nope.json"], ("nope.json", "no such file")),
        res("validate_empty_file", "validate", b"", ("r.json", "empty")),
        res("validate_not_json", "validate", "{not json", ("r.json", "JSON")),
        res("validate_no_trial_id", "validate", trial(drop("trial_id")), ("r.json", "trial_id")),
        res("validate_no_summary", "validate", trial(drop("summary")), ("r.json", "summary")),
        res("validate_no_records", "validate", trial(drop("records")), ("r.json", "records")),
        res("validate_status_great", "validate", trial(put("status", "great")), ("r.json", "status", "great")),
        res("validate_e2e_fast", "validate", trial(put("records.0.e2e_ms", "fast")), ("records[0].e2e_ms", "fast")),
        res("validate_records_wrong_shape", "validate", trial(put("records", [1, 2])), ("r.json", "records[0]")),
        res("validate_waive_unknown", "validate", trial(), ("--waive", "bogus"), "--waive", "bogus"),
        res("validate_min_measured_0", "validate", trial(), ("--min-measured",), "--min-measured", "0"),
        Case("load_no_such_path", ["load", "nope", "--database-url", "{db}"], ("nope", "no such file")),
        Case("load_folder_without_experiment", ["load", "runs", "--database-url", "{db}"],
             ("runs", "experiment.json"), {"runs/trials/t.json": "{}"}),
        res("load_not_json", "load", "{not json", ("r.json", "JSON")),
        res("load_no_trial_id", "load", trial(drop("trial_id")), ("r.json", "trial_id")),
        res("load_status_great", "load", trial(put("status", "great")), ("r.json", "status", "great")),
        res("load_waive_unknown", "load", trial(), ("--waive", "bogus"), "--waive", "bogus"),
        # --- database URLs: never a password ---
        dbu("db_url_malformed", "not-a-url", ("database", "not-a-url")),
        dbu("db_url_bad_port", f"postgresql://u:{SECRET}@127.0.0.1:port/db", ("port",)),
        dbu("db_url_not_postgres", f"mysql://u:{SECRET}@127.0.0.1/db", ("mysql",)),
        dbu("db_wrong_port", dead, ("127.0.0.1", str(p))),
        dbu("db_unknown_host", f"postgresql://u:{SECRET}@no-such-host.invalid/db", ("no-such-host.invalid",)),
        dbu("db_password_with_at", f"postgresql://u:{SECRET}@x@127.0.0.1:{p}/db", ("127.0.0.1",)),
        Case("db_no_url", ["db", "current"], ("SERVETUNE_DATABASE_URL", "--database-url")),
        Case("db_downgrade_base_no_yes", ["db", "downgrade", "base", "--database-url", dead], ("--yes",)),
        Case("db_unknown_revision", ["db", "upgrade", "nosuchrev", "--database-url", "{db}"], ("nosuchrev",)),
        Case("load_wrong_port", ["load", "r.json", "--database-url", dead], ("127.0.0.1", str(p)), {"r.json": trial()}),
        # --- query, history, report ---
        Case("query_wrong_port", [*q, "-p", "model=m", "--database-url", dead], ("127.0.0.1", str(p))),
        Case("query_unknown_name", ["query", "nope", "--database-url", "{db}"], ("nope", "ceiling_last_month")),
        Case("query_param_no_equals", [*q, "-p", "model"], ("--param", "model")),
        Case("query_param_unknown", [*q, "-p", "model=m", "-p", "colour=red", *live], ("colour",)),
        Case("query_param_wrong_type", [*q, "-p", "model=m", "-p", "days=many", *live], ("days", "many")),
        Case("query_format_unknown", [*q, "--format", "xml"], ("--format", "xml")),
        Case("history_no_model", ["history"], ("--model",)),
        Case("history_limit_0", ["history", "--model", "m", "--limit", "0"], ("--limit",)),
        Case("report_no_such_source", ["report", "nope.json"], ("nope.json",)),
        Case("report_not_json", ["report", "r.json"], ("r.json", "JSON"), {"r.json": "{not json"}),
        Case("report_empty_folder", ["report", "runs"], ("runs",), {"runs/.keep": ""}),
        Case("report_unknown_experiment", ["report", xid, *live], (xid,)),
        Case("report_id_unreachable", ["report", xid, "--database-url", dead], ("127.0.0.1", str(p))),
        # --- serve --dry-run ---
        Case("serve_engine_unknown", ["serve", "--engine", "tgi", "--dry-run"], ("--engine", "tgi")),
        Case("serve_no_model", ["serve", "--engine", "sglang", "--dry-run"], ("--model",)),
        serve("serve_flag_unknown", ["--set", "no-such-flag=1"], ("no-such-flag",)),
        serve("serve_set_no_equals", ["--set", "tp-size"], ("--set", "tp-size")),
        serve("serve_flag_wrong_type", ["--set", "max-running-requests=lots"], ("max-running-requests", "lots")),
        serve("serve_flag_out_of_range", ["--set", "mem-fraction-static=1.5"], ("mem-fraction-static", "1.5")),
        serve("serve_port_70000", ["--port", "70000"], ("--port", "70000")),
        serve("serve_gpus_bad", ["--gpus", "0,x"], ("--gpus", "0,x")),
        serve("serve_runner_unknown", ["--runner", "slurm"], ("--runner", "slurm")),
        serve("serve_ssh_no_host", ["--runner", "ssh"], ("--ssh-host",)),
        serve("serve_secret_and_bad_flag", ["--set", f"api-key={SECRET}", "--set", "no-such=1"], ("no-such",)),
        Case("serve_external_no_url", ["serve", "--engine", "external", "--dry-run"], ("--url",)),
        *(serve(*c) for c in more.SERVE),
        Case("serve_option_not_for_engine", ["serve", "--engine", "vllm", "--model", "m", "--gpu-profile", "H100"],
             ("--gpu-profile", "vllm")),
        # --- sim serve ---
        Case("sim_unknown_flag", ["sim", "serve", "--no-such-flag"], ("--no-such-flag",)),
        Case("sim_model_profile_unknown", ["sim", "serve", "--model-profile", "nope"], ("--model-profile", "nope")),
        Case("sim_gpu_profile_unknown", ["sim", "serve", "--gpu-profile", "nope"], ("--gpu-profile", "nope")),
        Case("sim_port_text", ["sim", "serve", "--port", "abc"], ("--port", "abc")),
        Case("sim_mem_fraction_1_5", ["sim", "serve", "--mem-fraction-static", "1.5"], ("--mem-fraction-static",)),
        Case("sim_tp_size_negative", ["sim", "serve", "--tp-size", "-2"], ("--tp-size",)),
        # --- the command line itself ---
        Case("unknown_command", ["tunee"], ("tunee",)),
        Case("unknown_global_option", ["--verbosee", "tune"], ("--verbosee",)),
    ]


KNOWN: dict[str, str] = {}  # cases that still fail, with the owner and what to change (none now)
CASES: list[Case] = [replace(c, known=KNOWN.get(c.name)) for c in _cases()]


def clean_env() -> dict[str, str]:
    """The caller's environment without a database URL or Airflow connection; an 80-column pipe, as in CI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVETUNE_", "AIRFLOW_CONN_", "FORCE_COLOR"))}
    return {**env, "COLUMNS": "80", "NO_COLOR": "1"}


def prepare(case: Case, where: Path, db: str | dict[str, str] | None) -> list[str]:
    """Write the case's files into ``where`` (a ``Link`` as a symlink); its argv with ``{db}`` filled in, or
    every ``{place}`` of ``places()`` when given them all."""
    where.mkdir(parents=True, exist_ok=True)
    for rel, text in case.files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, boundary.Link):
            (where / rel).symlink_to(str(text))
        else:
            (where / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    filled = db if isinstance(db, dict) else {"db": db or "{db}"}
    argv = list(case.argv)
    for key, value in filled.items():
        argv = [a.replace(f"{{{key}}}", value) for a in argv]
    return argv



def run_subprocess(case: Case, where: Path, db: str | None = None, timeout: float = 60.0) -> Outcome:
    """``python -m servetune ARGV`` in ``where``: the real entry point, as a user runs it."""
    argv = prepare(case, where, db)
    try:
        proc = subprocess.run([sys.executable, "-m", "servetune", *argv], cwd=where, env=clean_env(),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Outcome(124, "", f"timed out after {timeout:g} s")
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def table(cases: list[Case], outcomes: list[Outcome]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("`", "'")

    rows = ["| case | command | exit | message | clear |", "|---|---|---|---|---|"]
    for case, out in zip(cases, outcomes, strict=True):
        found = problems(case, out)
        ok = "yes" if not found else (f"known: {case.known}" if case.known else "**NO**: " + "; ".join(found))
        argv = shlex.join(["servetune", *case.argv]).replace(SECRET, "***")
        rows.append(f"| {case.name} | `{cell(argv)}` | {out.code} | {cell(' / '.join(out.message()))} | {ok} |")
    return "\n".join(rows)


def main(names: list[str]) -> int:
    cases = [c for c in CASES if not names or c.name in names]
    with boundary.warehouse() as db, ThreadPoolExecutor(2) as pool:
        def one(case: Case) -> Outcome:
            with TemporaryDirectory(prefix="bad-input-") as tmp:
                return run_subprocess(case, Path(tmp), db)

        outcomes = list(pool.map(one, cases))
    print(table(cases, outcomes))
    failed = [c for c, o in zip(cases, outcomes, strict=True) if problems(c, o)]
    bad, known = [c.name for c in failed if not c.known], [c.name for c in failed if c.known]
    print(f"\n{len(cases)} cases: {len(cases) - len(bad) - len(known)} clear, {len(known)} known (xfail),"
          f" {len(bad)} not clear" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
