"""Whole campaigns against the simulator in virtual time: the result folder, failures, budget, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.plan import TuningPlan, load_plan, parse_plan
from servetune.result import TrialResult
from servetune.tuning.campaign import Campaign, dry_run
from servetune.tuning.runner import SimTrialRunner

PLANS = Path(__file__).resolve().parent.parent / "plans"
EXPERIMENT_KEYS = {"experiment_id", "model", "engine", "model_fingerprint", "prompt_template_fingerprint", "trigger",
                   "dag_run_id", "plan", "status", "started_at", "finished_at", "recommendation"}
RECOMMENDATION_KEYS = {"config", "concurrency", "evidence_trial_ids", "goodput_rps", "p99_ttft_ms", "p99_tpot_ms",
                       "p99_e2e_ms", "output_tokens_per_s", "prefix_hit_rate", "explanation", "diff_from_previous",
                       "repeats", "goodput_ci95", "goodput_cv", "ties", "rate", "robustness", "objective",
                       "energy_per_output_token_j", "gpu_power_window_mean_w", "cost_per_mtok_usd",
                       "cost_per_1k_good_usd", "vs_deployed", "trial_size"}


def small_plan(**over) -> TuningPlan:
    data = {
        "name": "small", "model": "llama-3.1-8b",
        "engine": {"kind": "sim", "gpu_profile": "A100-80G", "model_profile": "llama-3.1-8b"},
        "workload": {"seed": 2, "input": {"kind": "uniform", "min": 128, "max": 512},
                     "output": {"kind": "uniform", "min": 16, "max": 32},
                     "shared_prefix": {"tokens": 128, "share_ratio": 0.8}},
        "sla": {"p99_ttft_ms": 1000, "p99_tpot_ms": 40},
        "stages": {"correctness": {"requests": 1}, "baseline": {"concurrency": 4, "requests": 24, "warmup": 2},
                   "ramp": {"levels": [8, 16, 32, 64], "requests": 32, "warmup": 4, "bisect_min_step": 8},
                   "refine": {"grid": {"chunked-prefill-size": [1024, 4096],
                                       "schedule-conservativeness": [0.7, 1.0]}, "extend_levels": 1}},
        "budget": {"max_gpu_minutes": 60, "restart_cost_s": 5},
    }
    data.update(over)
    return parse_plan(data)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_virtual_campaign_writes_the_shared_result_folder(tmp_path: Path) -> None:
    plan = small_plan()
    decision = Campaign(plan, SimTrialRunner(plan), tmp_path, trigger="bench").run()
    assert decision.done and not decision.failed

    exp = read(tmp_path / "experiment.json")
    assert EXPERIMENT_KEYS <= set(exp)
    assert exp["status"] == "done" and exp["trigger"] == "bench" and exp["engine"] == "sim"
    assert exp["plan"]["name"] == "small" and exp["finished_at"] >= exp["started_at"]
    rec = read(tmp_path / "recommendation.json")
    assert set(rec) == RECOMMENDATION_KEYS
    assert exp["recommendation"] == rec
    assert exp["ceiling"]["concurrency"] == decision.ceiling.level

    trials = {p.stem: TrialResult.read(p) for p in (tmp_path / "trials").glob("*.json")}
    stages = [t.stage for t in sorted(trials.values(), key=lambda t: t.created_at)]
    assert stages[:3] == ["correctness", "baseline", "ramp"] and "refine" in stages
    assert all(t.experiment_id == exp["experiment_id"] for t in trials.values())
    # every trial keeps its workload spec, with the repeat's seed, as a live trial does (diagnose reads it)
    specs = {t.trial_id: t.workload["spec"] for t in trials.values()}
    assert all(sp["name"] == plan.workload.name and sp["shared_prefix"] == plan.workload.shared_prefix.model_dump(
        mode="json") for sp in specs.values())
    assert {sp["seed"] for sp in specs.values()} >= {plan.workload.seed}
    assert set(rec["evidence_trial_ids"]) <= set(trials)
    chosen = trials[rec["evidence_trial_ids"][0]]
    # the answer's own seeds come first (then the baseline, ceiling and compared trials): its goodput is their mean
    evidence = [trials[t].summary.goodput_rps for t in rec["evidence_trial_ids"][:rec["repeats"]]]
    assert rec["goodput_rps"] == pytest.approx(sum(evidence) / len(evidence))
    assert {trials[t].server_config == rec["config"] for t in rec["evidence_trial_ids"][:rec["repeats"]]} == {True}
    assert chosen.server_config == rec["config"]
    assert any("token_usage" in line for line in rec["explanation"])
    assert rec["prefix_hit_rate"] is not None and 0 < rec["prefix_hit_rate"] <= 1


def test_refinement_is_not_the_grid(tmp_path: Path) -> None:
    plan = small_plan()
    _, outcomes, specs = dry_run(plan, SimTrialRunner(plan))
    configs = {tuple(sorted((k, str(v)) for k, v in s.flags.items())) for s in specs if s.stage == "refine"}
    assert 0 < len(configs) < 2 * 2 * 2  # chunk x conservativeness x max-running
    changes = 1 + sum(a.flags != b.flags for a, b in zip(specs, specs[1:], strict=False))
    assert [o.restarted for o in outcomes].count(True) == changes  # every server-side change restarted
    first_refine = next(o for o in outcomes if o.stage == "refine")
    assert first_refine.restarted and first_refine.gpu_seconds >= plan.budget.restart_cost_s


def test_a_refused_config_is_recorded_and_the_campaign_goes_on(tmp_path: Path) -> None:
    plan = small_plan(stages={
        "correctness": {"requests": 1}, "baseline": {"concurrency": 4, "requests": 24, "warmup": 2},
        "ramp": {"levels": [8, 16], "requests": 24, "warmup": 2, "bisect": False},
        "refine": {"grid": {"mem-fraction-static": [0.05, 0.85]}, "set_max_running": False,  # weights do not fit
                   "extend_levels": 0}})
    decision = Campaign(plan, SimTrialRunner(plan), tmp_path).run()
    failed = [TrialResult.read(p) for p in (tmp_path / "trials").glob("*.json")]
    failed = [t for t in failed if t.status == "failed"]
    assert len(failed) == 1 and "server failed to start" in (failed[0].failure_reason or "")
    assert failed[0].server_config["mem-fraction-static"] == 0.05 and failed[0].stage == "refine"
    assert decision.recommendation is not None and decision.recommendation.config.get("mem-fraction-static") != 0.05
    assert read(tmp_path / "experiment.json")["status"] == "done"


def test_stop_on_failure_ends_the_campaign_after_the_failed_trial(tmp_path: Path) -> None:
    plan = small_plan(on_trial_failure="stop", stages={
        "correctness": {"requests": 1}, "baseline": {"concurrency": 4, "requests": 24, "warmup": 2},
        "ramp": {"levels": [8], "requests": 24, "warmup": 2},
        "refine": {"grid": {"mem-fraction-static": [0.05, 0.85]}}})
    decision = Campaign(plan, SimTrialRunner(plan), tmp_path).run()
    trials = [TrialResult.read(p) for p in (tmp_path / "trials").glob("*.json")]
    assert max(trials, key=lambda t: t.created_at).status == "failed"
    assert "on_trial_failure: stop" in decision.reason and decision.recommendation is not None


def test_a_stop_request_ends_the_campaign_between_trials_even_after_the_last(tmp_path: Path) -> None:
    """The flag a signal handler sets stops the campaign before the next trial, and before the answer:
    a signal whose KeyboardInterrupt was swallowed during the last trial still reads interrupted."""
    plan = small_plan()
    c = Campaign(plan, SimTrialRunner(plan), tmp_path / "mid")
    with pytest.raises(KeyboardInterrupt):
        c.run(stop=lambda: len(c.state.outcomes) >= 2)
    assert len(c.state.outcomes) == 2
    assert json.loads((tmp_path / "mid" / "experiment.json").read_text())["status"] == "interrupted"
    straight = Campaign(plan, SimTrialRunner(plan), tmp_path / "straight")
    straight.run()
    n = len(straight.state.outcomes)
    late = Campaign(plan, SimTrialRunner(plan), tmp_path / "late")
    with pytest.raises(KeyboardInterrupt):
        late.run(stop=lambda: len(late.state.outcomes) >= n)  # set during the last trial
    assert len(late.state.outcomes) == n and not (tmp_path / "late" / "recommendation.json").exists()


def test_budget_is_enforced_in_virtual_time(tmp_path: Path) -> None:
    plan = small_plan(budget={"max_gpu_minutes": 0.1, "restart_cost_s": 5})  # 6 s of GPU
    c = Campaign(plan, SimTrialRunner(plan), tmp_path)
    decision = c.run()
    assert "GPU budget spent" in decision.reason
    spent_before_last = c.state.gpu_seconds - c.state.outcomes[-1].gpu_seconds
    assert spent_before_last < 6 <= c.state.gpu_seconds  # stopped at the first trial past the budget


def test_previous_recommendation_is_diffed(tmp_path: Path) -> None:
    plan = small_plan()
    prev = {"config": {"chunked-prefill-size": 2048}, "concurrency": 3, "goodput_rps": 1.0}
    d = Campaign(plan, SimTrialRunner(plan), tmp_path, previous=prev).run()
    diff = read(tmp_path / "recommendation.json")["diff_from_previous"]
    assert diff["config"]["chunked-prefill-size"]["old"] == 2048
    assert diff["figures"]["concurrency"]["new"] == d.recommendation.concurrency


def test_cli_virtual_campaign_and_dry_run(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(app, ["tune", str(PLANS / "demo.yaml"), "--virtual", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "recommendation.json").is_file() and read(out / "experiment.json")["status"] == "done"
    assert "ramp" in res.output and "ETA" in res.output and "recommendation" in res.output
    # the answer on stdout (`> file` keeps it), the progress on stderr
    assert "recommendation" in res.stdout and "written to" in res.stdout and res.stdout.startswith("done: ")
    assert "ETA" in res.stderr and "ETA" not in res.stdout and "recommendation" not in res.stderr

    res = runner.invoke(app, ["tune", str(PLANS / "demo.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "estimated GPU time" in res.stdout and "baseline" in res.stdout


def test_cli_dry_run_of_a_real_plan_uses_its_estimate_profiles() -> None:
    plan = load_plan(PLANS / "8b-chat.yaml")
    assert plan.estimate is not None
    res = CliRunner().invoke(app, ["tune", str(PLANS / "8b-chat.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "estimated GPU time" in res.output


@pytest.mark.parametrize("content", ["name: x\nmodel: m\nsla: {}\n", "name: x\nmodel: m\nsla: {p99_ttft_ms: 1}\n"
                                     "stages: {ramp: {levels: [1]}}\n"])
def test_cli_rejects_a_bad_plan_before_anything_starts(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    res = CliRunner().invoke(app, ["tune", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "sla" in res.output or "stages" in res.output
    assert not (tmp_path / "out").exists()


def test_experiment_carries_model_and_template_fingerprints(tmp_path: Path) -> None:
    from servetune.fingerprint import model_fingerprint, prompt_template_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    plan = small_plan(model=str(model), stages={"correctness": {"enabled": False},
                                                "baseline": {"concurrency": 2, "requests": 8},
                                                "ramp": {"levels": [4], "requests": 8}, "refine": {"enabled": False}})
    Campaign(plan, SimTrialRunner(plan), tmp_path / "out").run()
    exp = read(tmp_path / "out" / "experiment.json")
    assert exp["model_fingerprint"] == model_fingerprint(str(model)).digest
    assert exp["prompt_template_fingerprint"] == prompt_template_fingerprint(str(model)).digest
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ other }}"}')
    assert prompt_template_fingerprint(str(model)).digest != exp["prompt_template_fingerprint"]
