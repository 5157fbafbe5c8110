"""bench/faults.py's faults around a campaign, an engine and the warehouse: a live ``servetune tune`` whose engine
is killed or which is itself signalled or run twice, ``servetune serve`` of tests/fake_engines' SGLang (a worker
that leaves the process group) killed or losing its engine, and ``servetune load`` against a PostgreSQL that is
stopped, frozen mid-statement or locked. Each returns (what the user saw, exit code); the checks go to ctx."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml

from faults_kit import SECRET, TESTS, Ctx, FaultSetupError, Warehouse, campaign_folder, tagged, wait_until

#: tests/airflow_fixtures.py's tiny plan (one ramp level, no refinement: about 20 s live on 2 cores) with a secret in
#: the engine's env
PLAN = {
    "name": "faults-sim", "model": "llama-3.1-8b",
    "engine": {"kind": "sim", "model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G", "load_seconds": 0.2,
               "env": {"HF_TOKEN": SECRET}},
    "runner": {"kind": "local"}, "endpoint": "chat",
    "workload": {"name": "tiny", "seed": 1, "input": {"kind": "uniform", "min": 64, "max": 256},
                 "output": {"kind": "fixed", "value": 8},
                 "shared_prefix": {"tokens": 32, "share_ratio": 0.8, "num_prefixes": 1}},
    "sla": {"p99_ttft_ms": 2000, "p99_tpot_ms": 200},
    "stages": {"correctness": {"requests": 1}, "baseline": {"concurrency": 2, "requests": 12, "warmup": 2},
               "ramp": {"levels": [4], "requests": 16, "warmup": 2, "bisect": False}, "refine": {"enabled": False}},
    "validation": {"min_measured": 10, "min_window_s": 1.0, "min_completions": 12, "completions_per_stream": 2},
    "repeats": {"count": 1, "invalid_retries": 2},
    "budget": {"max_gpu_minutes": 10, "restart_cost_s": 1},
}
RAMP_4 = r"ramp\s+level\s+4\s+start"
TUNE_S = 240


def _tune(ctx: Ctx, *extra: str) -> list[str]:
    plan = ctx.write("plan.yaml", yaml.safe_dump(PLAN, sort_keys=False))
    return ["tune", plan, "--out", str(ctx.tmp / "run"), *extra]


def _tune_env(ctx: Ctx) -> dict[str, str]:
    return {"SERVETUNE_LOG_DIR": str(ctx.tmp / "logs")}  # the engine logs, searched for the secret too


def _engine_leader(ctx: Ctx) -> int:
    """The simulated engine a tagged ``tune`` started: its process group leader."""
    def find() -> int | None:
        for p in tagged(ctx.tag):
            try:
                if "sim" in p.cmdline() and "serve" in p.cmdline() and os.getpgid(p.pid) == p.pid:
                    return p.pid
            except (psutil.Error, OSError):
                pass
        return None
    return wait_until(find, 20, "the campaign's engine process")


def _campaign(ctx: Ctx) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = ctx.tmp / "run"
    exp = orjson.loads((run / "experiment.json").read_bytes())
    return exp, orjson.loads((run / "state.json").read_bytes())["outcomes"]


def _each_trial_once(ctx: Ctx) -> list[dict[str, Any]]:
    """Every outcome has its trial file and no decision was measured twice (nothing lost, nothing doubled)."""
    exp, outcomes = _campaign(ctx)
    files = {p.stem for p in (ctx.tmp / "run" / "trials").glob("*.json")}
    ctx.check({o["trial_id"] for o in outcomes} == files, f"{len(outcomes)} outcomes but {len(files)} trial files")
    key = Counter((o["stage"], o["concurrency"], str(o["flags"]), o["seed_offset"]) for o in outcomes
                  if o["status"] == "ok" and (o["summary"] or {}).get("valid") is not False)
    ctx.check(all(n == 1 for n in key.values()),
              f"a valid trial measured twice: {[k for k, n in key.items() if n > 1]}")
    ctx.check(not list((ctx.tmp / "run").rglob("*.tmp")), "a partial (.tmp) file is left in the campaign folder")
    ctx.check(exp["status"] == "done" and (exp.get("ceiling") or {}).get("kind") != "fault",
              f"campaign {exp['status']}, ceiling {exp.get('ceiling')}")
    ctx.check((ctx.tmp / "run" / "recommendation.json").is_file(), "no recommendation.json")
    return outcomes


def engine_killed_mid_campaign(ctx: Ctx) -> tuple[str, str]:
    run = ctx.start(*_tune(ctx), **_tune_env(ctx))
    run.wait_for(RAMP_4, 120)
    leader = _engine_leader(ctx)
    time.sleep(0.5)
    os.killpg(leader, signal.SIGKILL)
    out = run.finish(TUNE_S)
    line = ctx.line(out, r"engine_crash", "level", "4")
    ctx.check(out.code == 0, f"exit {out.code}, expected 0 (an answer)")
    outcomes = _each_trial_once(ctx)
    crashed = [o for o in outcomes if (o["failure_reason"] or "").startswith("engine_crash")]
    ctx.check(len(crashed) == 1 and crashed[0]["concurrency"] == 4, f"crashed trials: {crashed}")
    ctx.check(any(o["concurrency"] == 4 and o["status"] == "ok" for o in outcomes), "level 4 not re-run")
    ctx.check(not psutil.pid_exists(leader) or psutil.Process(leader).status() == psutil.STATUS_ZOMBIE,
              "the killed engine is still there")
    return line, str(out.code)


def tune_sigterm_then_resume(ctx: Ctx) -> tuple[str, str]:
    run = ctx.start(*_tune(ctx), **_tune_env(ctx))
    run.wait_for(RAMP_4, 120)
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGTERM)
    out = run.finish(60)
    line = ctx.line(out, r"^interrupted after", "--resume")
    ctx.check(out.code == 130, f"exit {out.code}, expected 130")
    ctx.check(_campaign(ctx)[0]["status"] == "interrupted", f"status {_campaign(ctx)[0]['status']}")
    ctx.check(not [p for p in tagged(ctx.tag) if "sim" in p.cmdline()], "the engine outlived the interrupted tune")
    again = ctx.servetune(*_tune(ctx, "--resume"), timeout=TUNE_S, **_tune_env(ctx))
    ctx.check(again.code == 0, f"--resume: exit {again.code}: {again.lines()[-1:]}")
    _each_trial_once(ctx)
    return line, f"{out.code}, resume {again.code}"


def tune_sigkill_then_resume(ctx: Ctx) -> tuple[str, str]:
    run = ctx.start(*_tune(ctx), **_tune_env(ctx))
    run.wait_for(RAMP_4, 120)
    leader = _engine_leader(ctx)
    time.sleep(0.5)
    run.proc.kill()
    out = run.finish(30)
    try:
        wait_until(lambda: not tagged(ctx.tag), 15, "the orphaned engine's end", 0.2)
    except FaultSetupError:
        ctx.check(False, f"the engine (pid {leader}) outlived the killed tune by 15 s")
    again = ctx.servetune(*_tune(ctx, "--resume"), timeout=TUNE_S, **_tune_env(ctx))
    line = ctx.line(again, r"^done:", "recommendation")
    ctx.check(again.code == 0, f"--resume: exit {again.code}")
    _each_trial_once(ctx)
    return "(killed: no last word) then --resume: " + line, f"{out.code}, resume {again.code}"


def two_resumes_at_once(ctx: Ctx) -> tuple[str, str]:
    first = ctx.servetune(*_tune(ctx, "--stop-after", "1"), timeout=TUNE_S, **_tune_env(ctx))
    if first.code != 75:
        raise FaultSetupError(f"--stop-after 1 gave exit {first.code}, not 75 (paused)")
    a = ctx.start(*_tune(ctx, "--resume"), **_tune_env(ctx))
    lock = ctx.tmp / "run" / ".campaign.lock"
    wait_until(lambda: lock.is_file() and f"pid {a.pid} " in lock.read_text(), 60, "the first resume's lock")
    b = ctx.servetune(*_tune(ctx, "--resume"), timeout=60, **_tune_env(ctx))
    line = ctx.line(b, r"^error:", "--resume", f"pid {a.pid}", "is running this campaign")
    ctx.check(b.code == 2, f"second resume: exit {b.code}, expected 2")
    ctx.check(len(b.lines()) == 1, f"second resume printed {len(b.lines())} lines")
    done = a.finish(TUNE_S)
    ctx.check(done.code == 0, f"first resume: exit {done.code}")
    _each_trial_once(ctx)
    return line, f"{b.code} (first: {done.code})"


# --- servetune serve with tests/fake_engines' SGLang -------------------------------------------------

def _serve_fake(ctx: Ctx) -> tuple[Any, int, list[int]]:
    run = ctx.start("serve", "--engine", "sglang", "--model", "/models/fake", "--python", sys.executable,
                    "--log-dir", str(ctx.tmp / "logs"), PYTHONPATH=str(TESTS / "fake_engines"),
                    FAKE_ENGINE_MODE="ok", FAKE_ENGINE_WORKERS="2", FAKE_ENGINE_ESCAPE="1")
    m = run.wait_for(r"^ready: \S+ .*pid (\d+), log (\S+)\)", 60)
    log = m.group(2)
    workers = wait_until(lambda: re.search(r"^workers: ([\d ]+)$", Path(log).read_text(), re.MULTILINE), 20,
                         "the workers line")
    pids = [int(m.group(1)), *map(int, workers.group(1).split())]
    if os.getsid(pids[-1]) != pids[-1]:
        raise FaultSetupError("the fake engine's last worker did not leave the session")
    return run, pids[0], pids


def _gone(ctx: Ctx, pids: list[int]) -> None:
    def alive() -> list[int]:
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    try:
        wait_until(lambda: not alive(), 15, "the engine's processes to end", 0.2)
    except FaultSetupError:
        ctx.check(False, f"engine processes alive 15 s later: {alive()} of {pids}")


def serve_killed_escaped_worker(ctx: Ctx) -> tuple[str, str]:
    run, _, pids = _serve_fake(ctx)
    ready = run.wait_for(r"^ready: .*$", 1).group(0)
    run.proc.kill()
    out = run.finish(30)
    _gone(ctx, pids)
    return f"{ready} (then killed: no more output)", str(out.code)


def engine_died_under_serve(ctx: Ctx) -> tuple[str, str]:
    run, leader, pids = _serve_fake(ctx)
    os.kill(leader, signal.SIGKILL)  # the leader alone: its workers are orphaned
    out = run.finish(60)
    line = ctx.line(out, r"^died:", "exited")
    ctx.check(out.code == 1, f"exit {out.code}, expected 1")
    _gone(ctx, pids)
    return line, str(out.code)


# --- servetune load against a private PostgreSQL -----------------------------------------------------

def _load(ctx: Ctx, url: str, folder: Any, **env: str) -> Any:
    return ctx.servetune("load", str(folder), "--no-validate", timeout=120, SERVETUNE_DATABASE_URL=url,
                         SERVETUNE_DB_CONNECT_TIMEOUT="2", **env)


def _retry_stores_once(ctx: Ctx, wh: Warehouse, url: str, folder: Any, exp_id: str, rows: int) -> None:
    ctx.check(wh.stored(url, exp_id) == (0, 0, 0), f"the failed load left rows: {wh.stored(url, exp_id)}")
    out = _load(ctx, url, folder)
    ctx.check(out.code == 0 and out.stdout.count("inserted") == 3, f"retry: exit {out.code}, not 3 trials inserted")
    ctx.check(wh.stored(url, exp_id) == (3, 3, rows), f"stored {wh.stored(url, exp_id)}, expected (3, 3, {rows})")


def pg_stopped_before_load(ctx: Ctx) -> tuple[str, str]:
    wh = Warehouse.get()
    folder, rows = campaign_folder(ctx, "stopped-1")
    with wh.database() as url:
        wh.pg.halt()
        try:
            out = _load(ctx, url, folder)
        finally:
            wh.pg.serve()
        line = ctx.line(out, r"^load:", wh.where, "not reachable")
        ctx.check(out.code == 2 and len(out.lines()) == 1, f"exit {out.code}, {len(out.lines())} lines")
        ctx.check(out.seconds < 10, f"took {out.seconds:.1f} s")
        _retry_stores_once(ctx, wh, url, folder, "stopped-1", rows)
    return line, str(out.code)


def pg_frozen_mid_load(ctx: Ctx) -> tuple[str, str]:
    wh = Warehouse.get()
    folder, rows = campaign_folder(ctx, "frozen-1")
    with wh.database() as url:
        db = url.rsplit("/", 1)[1]
        holder, watcher = wh.connect(url), wh.connect(url, autocommit=True)
        holder.execute("LOCK TABLE experiments IN ACCESS EXCLUSIVE MODE")  # to catch the load mid-statement
        run = ctx.start("load", str(folder), "--no-validate", SERVETUNE_DATABASE_URL=url,
                        SERVETUNE_DB_RESPONSE_TIMEOUT="4", SERVETUNE_DB_LOCK_TIMEOUT="60")
        frozen = None
        try:
            frozen = wait_until(lambda: watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = %s", (db,)).fetchone(),
                60, "the load's backend waiting on the lock")[0]
            os.kill(frozen, signal.SIGSTOP)
            t = time.monotonic()
            holder.rollback()  # the lock is free: a live backend would go on now
            out = run.finish(60)
            waited = time.monotonic() - t
        finally:
            if frozen:
                os.kill(frozen, signal.SIGCONT)
            holder.close()
            watcher.close()
        line = ctx.line(out, r"^load:", wh.where, "response_timeout=4 s", "not committed")
        ctx.check(out.code == 2 and len(out.lines()) == 1, f"exit {out.code}, {len(out.lines())} lines")
        ctx.check(waited < 4 + 4, f"ended {waited:.1f} s after the freeze (bound 4 s)")
        _retry_stores_once(ctx, wh, url, folder, "frozen-1", rows)
    return line, str(out.code)


def warehouse_lock_held(ctx: Ctx) -> tuple[str, str]:
    wh = Warehouse.get()
    folder, rows = campaign_folder(ctx, "locked-1")
    with wh.database() as url:
        holder = wh.connect(url)
        holder.execute("LOCK TABLE experiments IN ACCESS EXCLUSIVE MODE")  # a migration would hold this
        try:
            out = _load(ctx, url, folder, SERVETUNE_DB_LOCK_TIMEOUT="1")
        finally:
            holder.rollback()
            holder.close()
        line = ctx.line(out, r"^load:", wh.where, "lock_timeout=1 s")
        ctx.check(out.code == 2 and len(out.lines()) == 1, f"exit {out.code}, {len(out.lines())} lines")
        ctx.check(out.seconds < 10, f"took {out.seconds:.1f} s")
        _retry_stores_once(ctx, wh, url, folder, "locked-1", rows)
    return line, str(out.code)
