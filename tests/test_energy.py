"""Energy and cost over a trial's window (servetune.energy): the counter where it exists, the integrated power
curve where it does not, the simulator's modelled power, the checklist's energy item, and the plan's objective.

The NVML counter itself is read on a real GPU (docs/gpu.md); here the samples are built the way the sampler
writes them, with numbers whose integrals are known."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servetune.cli import app
from servetune.energy import Cost, window_energy
from servetune.loadgen.config import LoadConfig
from servetune.plan import PlanError, parse_plan
from servetune.sim.virtual import simulate
from servetune.validation import validate
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, WorkloadSpec

PLANS = Path(__file__).resolve().parents[1] / "plans"


def samples(gpu: int, watts, *, step: float = 0.1, counter: bool = True, start_mj: int = 5_000_000) -> list[dict]:
    """A sampler's rows for one GPU: power ``watts(t)``, and the counter as its exact integral (mJ)."""
    out, energy_mj = [], float(start_mj)
    for k in range(101):
        t = k * step
        if k:
            energy_mj += (watts(t - step) + watts(t)) / 2 * step * 1000.0
        out.append({"t_s": t, "gpu": gpu, "mem_used": 1, "mem_total": 2, "util": 50.0, "power_w": watts(t),
                    "energy_mj": int(round(energy_mj)) if counter else None})
    return out


def energy_failures(result, **kw) -> set[str]:
    """The checklist's energy item on ``result``: the columns it failed on (it must have been judged)."""
    judged = [o for o in validate(result, min_measured=100, **kw).results if o.checklist == "energy"]
    assert len(judged) == (0 if "energy" in kw.get("waive", ()) else 3)
    return {o.column for o in judged if not o.success}


def gpu_part(rows: list[dict], state: str = "ok", limit: float = 700.0) -> dict:
    return {"state": state, "interval_ms": 100.0, "samples": rows,
            "devices": [{"index": g, "power_limit_w": limit} for g in sorted({r["gpu"] for r in rows})]}


def test_the_counter_gives_the_windows_joules_and_the_curve_agrees() -> None:
    rows = samples(0, lambda t: 200.0 + 30.0 * t) + samples(1, lambda t: 400.0)
    e = window_energy(gpu_part(rows), 2.0, 8.0)
    assert e is not None and e["method"] == "counter"
    # GPU 0: the integral of 200 + 30t over [2, 8] is 1200 + 15 (64 - 4) = 2100 J; GPU 1: 400 W x 6 s = 2400 J
    assert [round(g["joules"]) for g in e["gpus"]] == [2100, 2400]
    assert e["joules"] == pytest.approx(4500, abs=1) and e["mean_w"] == pytest.approx(750, abs=0.2)
    assert e["curve_over_counter"] == pytest.approx(1.0, abs=1e-3)
    assert e["peak_w"] == pytest.approx(200 + 30 * 8 + 400)
    assert [g["limit_w"] for g in e["gpus"]] == [700.0, 700.0]


def test_without_a_monotonic_counter_the_power_curve_is_integrated_and_says_so() -> None:
    rows = samples(0, lambda t: 300.0, counter=False)
    e = window_energy(gpu_part(rows), 1.0, 9.0)
    assert e is not None and e["method"] == "power_curve" and e["joules"] == pytest.approx(2400)
    assert e["curve_over_counter"] is None
    reset = samples(0, lambda t: 300.0)
    reset[50]["energy_mj"] = 0  # the driver reloaded mid-trial: the counter went back
    e = window_energy(gpu_part(reset), 1.0, 9.0)
    assert e is not None and e["method"] == "power_curve" and e["gpus"][0]["counter_monotonic"] is False


def test_samples_that_do_not_cover_the_window_give_no_energy() -> None:
    rows = samples(0, lambda t: 300.0)  # 0 .. 10 s
    assert window_energy(gpu_part(rows), 1.0, 14.0) is None
    assert window_energy(gpu_part(rows), 5.0, 5.0) is None
    half = samples(0, lambda t: 300.0) + samples(1, lambda t: 300.0)[:40]  # GPU 1 stops at 3.9 s
    assert window_energy(gpu_part(half), 1.0, 9.0) is None  # no total would be honest


def test_a_simulated_trial_has_modelled_energy_that_falls_per_token_as_the_batch_grows() -> None:
    reqs = build_requests(WorkloadSpec(seed=1, output=Fixed(value=128), input=Fixed(value=512)), 300).requests
    rows = []
    for c in (4, 64):
        r = simulate({"tp_size": 2}, reqs, LoadConfig(concurrency=c, warmup_requests=16), cost=Cost(gpu_hour_usd=3.0))
        s = r.summary
        assert s.energy_method == "modelled" and len(s.energy["gpus"]) == 2  # both TP ranks, summed
        assert s.energy_j == pytest.approx(s.gpu_power_window_mean_w * s.window_s)
        assert s.energy_per_output_token_j == pytest.approx(s.energy_j / (s.output_tokens_per_s * s.window_s))
        assert s.cost_gpus == 2 and s.cost_per_mtok_usd == pytest.approx(6.0 / 3600 / s.output_tokens_per_s * 1e6)
        rows.append(s)
    small, big = rows
    # a batch of 4 is memory-bound: the boards draw less, but far fewer tokens share the draw
    assert small.gpu_power_window_mean_w < big.gpu_power_window_mean_w <= 2 * 700
    assert big.energy_per_output_token_j < small.energy_per_output_token_j / 3
    assert energy_failures(r) == set()  # the checklist's energy item holds on a modelled trial


def test_the_checklist_rejects_a_counter_that_goes_back_and_power_above_the_limit() -> None:
    reqs = build_requests(WorkloadSpec(seed=2, output=Fixed(value=64), input=Fixed(value=256)), 250).requests
    r = simulate({}, reqs, LoadConfig(concurrency=8, warmup_requests=8))
    for k, s in enumerate(r.gpu["samples"]):
        s["energy_mj"] = 10_000 * k
    assert energy_failures(r) == set()
    r.gpu["samples"][5]["energy_mj"] = 0
    assert energy_failures(r) == {"energy_step_j"}
    r.gpu["samples"][5]["energy_mj"] = 50_000
    r.gpu["samples"][7]["power_w"] = 1.2 * r.gpu["devices"][0]["power_limit_w"]
    assert energy_failures(r) == {"power_headroom_w"}
    assert energy_failures(r, waive=["energy"]) == set()
    r.gpu["samples"][7]["power_w"] = 100.0
    r.summary.energy_method = "unavailable"  # a GPU trial whose samples gave no energy
    assert energy_failures(r) == {"energy_on_gpu"}


def test_a_plan_prices_its_gpus_and_names_its_objective() -> None:
    data = yaml.safe_load((PLANS / "demo.yaml").read_text())
    with pytest.raises(PlanError, match="objective cost_per_mtok needs cost.gpu_hour_usd"):
        parse_plan({**data, "objective": "cost_per_mtok"})
    with pytest.raises(PlanError, match="cost.gpu_hour_usd: Input should be a number, not a boolean"):
        parse_plan({**data, "cost": {"gpu_hour_usd": True}})
    plain = parse_plan(data)
    assert "cost" not in plain.model_dump() and "objective" not in plain.model_dump()  # older digests hold
    priced = parse_plan({**data, "cost": {"gpu_hour_usd": 2.5}, "objective": "goodput_per_watt"})
    assert priced.cost.gpu_hour_usd == 2.5 and priced.objective == "goodput_per_watt"


def _campaign(tmp_path: Path, objective: str) -> tuple[dict, list[dict]]:
    data = yaml.safe_load((PLANS / "demo.yaml").read_text())
    # goodput counts requests under a 30 ms TPOT; the SLA the levels must pass is a 60 ms p99 TPOT
    data |= {"objective": objective, "cost": {"gpu_hour_usd": 2.0},
             "sla": {"tpot_ms": 30, "p99_tpot_ms": 60, "p99_ttft_ms": 1000, "max_error_rate": 0.01}}
    data["stages"]["refine"] = {"enabled": False}
    plan, out = tmp_path / f"{objective}.yaml", tmp_path / objective
    plan.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["tune", str(plan), "--virtual", "--out", str(out)])
    assert res.exit_code == 0, res.output
    state = json.loads((out / "state.json").read_text())
    (tmp_path / "last").unlink(missing_ok=True)
    (tmp_path / "last").symlink_to(out)
    return json.loads((out / "recommendation.json").read_text()), state["outcomes"]


def test_cost_per_mtok_runs_the_answer_where_tokens_are_cheapest_and_goodput_where_requests_are_good(
        tmp_path: Path) -> None:
    by_goodput, outcomes = _campaign(tmp_path, "goodput")
    by_cost, same = _campaign(tmp_path, "cost_per_mtok")
    walk = [(o["stage"], o["concurrency"], o["requests"], o["summary"]["goodput_rps"]) for o in outcomes]
    assert walk == [(o["stage"], o["concurrency"], o["requests"], o["summary"]["goodput_rps"]) for o in same]
    # one walk (the ceiling is the SLA's either way): only the choice of level differs
    assert by_goodput["objective"] == "goodput" and by_cost["objective"] == "cost_per_mtok"
    assert by_cost["concurrency"] > by_goodput["concurrency"]
    # why: past the goodput answer more requests miss the 30 ms TPOT bound, yet the level still passes
    # the p99 SLA and the GPU emits more tokens per second, so each token costs less
    assert by_cost["goodput_rps"] < by_goodput["goodput_rps"]
    assert by_cost["output_tokens_per_s"] > by_goodput["output_tokens_per_s"]
    assert by_cost["cost_per_mtok_usd"] < by_goodput["cost_per_mtok_usd"] * 0.9
    assert by_cost["p99_tpot_ms"] <= 60
    note = next(e for e in by_cost["explanation"] if e.startswith("objective cost_per_mtok"))
    assert note.startswith(f"objective cost_per_mtok: concurrency {by_cost['concurrency']} ($")
    assert "against the goodput answer concurrency" in note and "the answer runs there" in note and "Mtok/$" in note
    # the report draws J/token against the level and quotes the answer's energy, cost and objective
    from servetune.report.html import write_report
    from servetune.report.sources import load_campaign

    campaign = load_campaign(str(tmp_path / "last"))
    html = write_report(campaign, tmp_path / "report").html_path.read_text()
    assert 'id="fig-energy"' in html and "the simulator&#39;s power model" in html
    assert f"{by_cost['cost_per_mtok_usd']:,.3f}" in html and "cost_per_mtok" in html
    assert f"{by_cost['energy_per_output_token_j']:,.3f}" in html
    # the answer is the engine defaults: the table says so and names the level (it showed headers only)
    assert '<tr id="rec-defaults"><td colspan="2">engine defaults: no flag changed</td></tr>' in html
    assert f'<tr id="rec-level"><td>concurrency (streams in flight)</td><td><strong>{by_cost["concurrency"]}<' in html


def test_energy_is_stored_queried_and_judged_the_same_in_the_warehouse(database_url) -> None:
    """The counter lands in gpu_samples, the figures in trials and energy_vs_level, and the stored-trial
    checklist (SQL) fails the same energy rows as the in-memory one."""
    from sqlalchemy import create_engine, text

    from servetune.ingest import load_result
    from servetune.validation.stored import validate_stored
    from warehouse_fixtures import migrated

    migrated(database_url)
    reqs = build_requests(WorkloadSpec(seed=3, output=Fixed(value=64), input=Fixed(value=256)), 250).requests
    good = simulate({}, reqs, LoadConfig(concurrency=8, warmup_requests=8), cost=Cost(gpu_hour_usd=2.0))
    good.experiment_id = None
    for k, s in enumerate(good.gpu["samples"]):
        s["energy_mj"] = 7_000_000 + 40_000 * k
    bad = copy.deepcopy(good)
    bad.trial_id = "energy-bad"
    bad.gpu["samples"][4]["energy_mj"] = 0
    bad.gpu["samples"][6]["power_w"] = 2 * bad.gpu["devices"][0]["power_limit_w"]
    for t in (good, bad):
        load_result(database_url, t, validate=False)
    for t in (good, bad):
        stored = validate_stored(t.trial_id, database_url=database_url, min_measured=100)
        mine = {(o.column, o.success) for o in validate(t, min_measured=100).results if o.checklist == "energy"}
        assert {(o.column, o.success) for o in stored.results if o.checklist == "energy"} == mine
    assert energy_failures(bad) == {"energy_step_j", "power_headroom_w"}
    eng = create_engine(database_url)
    try:
        with eng.connect() as conn:
            counter = conn.execute(text("SELECT max(energy_mj) - min(energy_mj) FROM gpu_samples WHERE trial_id = :t"),
                                   {"t": good.trial_id}).scalar()
            row = conn.execute(text("SELECT energy_method, energy_per_output_token_j, cost_per_mtok_usd,"
                                    " summary_energy->'gpus'->0->>'limit_w' FROM trials WHERE trial_id = :t"),
                               {"t": good.trial_id}).one()
    finally:
        eng.dispose()
    assert counter == 40_000 * (len(good.gpu["samples"]) - 1)
    s = good.summary
    assert row == ("modelled", pytest.approx(s.energy_per_output_token_j), pytest.approx(s.cost_per_mtok_usd), "400.0")


def test_history_shows_joules_per_token_where_measured_and_a_fall_is_green() -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from servetune.report.history import HistoryEntry, history_table

    def entry(i: int, joules: float | None) -> HistoryEntry:
        return HistoryEntry(experiment_id=f"exp{i}", started_at=datetime(2026, 11, i, tzinfo=UTC), status="done",
                            trigger="weekly", trials_ok=9, trials_total=9, ceiling=32, config={}, goodput_rps=10.0,
                            output_tokens_per_s=900.0, p99_ttft_ms=300.0, prefix_hit_rate=0.5,
                            hit_rate_source="recommendation", energy_per_output_token_j=joules)

    console = Console(width=220, record=True, color_system="truecolor")
    console.print(history_table("m", [entry(3, 0.40), entry(2, 0.55)]))  # newest first
    assert "J/out tok" in console.export_text(clear=False)
    newest = next(ln for ln in console.export_text(styles=True).splitlines() if "exp3" in ln)
    assert "0.400" in newest and "\x1b[1;32m↓" in newest  # fewer joules per token: better
    console = Console(width=220, record=True)
    console.print(history_table("m", [entry(3, None), entry(2, None)]))
    assert "J/out tok" not in console.export_text()  # no empty column where nothing was measured
