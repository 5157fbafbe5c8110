"""``servetune tune PLAN --dry-run`` under a GPU budget: the plan that fits, per stage, and what the budget leaves
out (servetune.tuning.budget_view), on the repository's plans in virtual time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servetune.cli import app
from servetune.plan import load_plan
from servetune.tuning import budget_view as bv
from servetune.tuning.state import TrialOutcome

PLANS = Path(__file__).resolve().parent.parent / "plans"


def _with_budget(tmp_path: Path, name: str, minutes: float) -> Path:
    """A temp copy of ``plans/NAME.yaml`` under another ``budget.max_gpu_minutes`` (the rest unchanged)."""
    data = yaml.safe_load((PLANS / f"{name}.yaml").read_text())
    data["budget"]["max_gpu_minutes"] = minutes
    path = tmp_path / f"{name.replace('/', '-')}-{minutes:g}min.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _dry_run_json(path: Path) -> tuple[dict, str]:
    """The --json document (stdout) and the human tables (stderr) of one dry run."""
    res = CliRunner().invoke(app, ["tune", str(path), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def test_a_plan_within_its_budget_fits_and_its_stages_add_up() -> None:
    doc, text = _dry_run_json(PLANS / "demo.yaml")  # 30 GPU min; the simulated campaign spends about half
    assert doc["fits"] is True and doc["left_out"] is None
    assert doc["budget"].startswith("fits: ") and f"of {30:g} GPU min" in doc["budget"]
    rows = {r["stage"]: r for r in doc["stages"]}
    trials = doc["trials"]
    assert rows["total"]["trials"] == len(trials) == sum(r["trials"] for s, r in rows.items() if s != "total")
    for stage in ("correctness", "baseline", "ramp", "refine"):
        assert rows[stage]["trials"] == sum(t["stage"] == stage for t in trials)
    # GPU time: trials and start-ups apart, together the dry run's estimate
    total = rows["total"]
    assert total["trial_s"] + total["startup_s"] == pytest.approx(doc["estimated_gpu_s"], abs=0.01)
    restart = load_plan(PLANS / "demo.yaml").budget.restart_cost_s
    assert total["startup_s"] == pytest.approx(total["starts"] * restart)  # each start charged the plan's cost
    assert rows["correctness"]["starts"] == 1 and rows["refine"]["configs"] >= 2
    assert rows["refine"]["configs"] == len({json.dumps(t["flags"], sort_keys=True)
                                             for t in trials if t["stage"] == "refine"})
    assert "per stage" in text and "budget: fits:" in text and "left out" not in text


def test_a_budget_spent_in_the_ramp_leaves_out_its_levels_and_the_refinement(tmp_path: Path) -> None:
    """plans/demo.yaml at 0.5 GPU min: the budget is spent after the ramp's second level."""
    doc, text = _dry_run_json(_with_budget(tmp_path, "demo", 0.5))
    assert doc["fits"] is False
    stages = [t["stage"] for t in doc["trials"]]
    assert "refine" not in stages and "bisect" not in stages
    gone = doc["left_out"]
    reached = {t["level"] for t in doc["trials"] if t["stage"] != "correctness"}
    assert gone["levels"] and all(g["level"] not in reached for g in gone["levels"])
    assert {g["stage"] for g in gone["levels"]} <= {"ramp", "bisect"}
    assert {"ramp"} <= {g["stage"] for g in gone["levels"]}
    refine = load_plan(PLANS / "demo.yaml").stages.refine
    assert len(gone["configs"]) >= len(refine.grid)  # every refinement config the whole campaign measures
    assert any("--chunked-prefill-size" in c["flags"] for c in gone["configs"])
    assert gone["robustness"] == []  # the demo plan asks for none
    whole = doc["whole_campaign_gpu_s"]
    assert doc["estimated_gpu_s"] + gone["gpu_seconds"] == pytest.approx(whole, abs=0.01)
    assert doc["budget"].startswith(f"does not fit: the budget stops it before trial {len(doc['trials']) + 1} (")
    assert f"{len(gone['levels'])} level" in doc["budget"]
    rec = gone["recommendation"]
    assert rec["budgeted"] is not None and rec["unlimited"] is not None
    same = ((rec["budgeted"]["flags"], rec["budgeted"]["level"])
            == (rec["unlimited"]["flags"], rec["unlimited"]["level"]))
    assert rec["differs"] is (not same)
    assert ("the same recommendation" in doc["budget"]) is same
    for r in gone["resized"]:  # measured again on a seed it ran, longer: the level's size grew after the budget
        assert r["requests"] > max(t["requests"] for t in doc["trials"] if t["level"] == r["level"])
    assert "levels never reached: concurrency" in text and "refinement configs not measured" in text


def test_a_small_budget_on_the_vlm_rate_plan_keeps_the_robustness_checks_and_leaves_out_the_refinement(
        tmp_path: Path) -> None:
    """plans/gpu-h200-vlm-rate.yaml at 6 of its 30 GPU min: the budget reaches the capacity on every seed, then
    keeps its robustness reserve, so the refinement (each candidate a server restart) is what it leaves out, and
    the answer under the budget is checked under bursts like the whole campaign's."""
    doc, text = _dry_run_json(_with_budget(tmp_path, "gpu-h200-vlm-rate", 6))
    assert doc["fits"] is False
    gone = doc["left_out"]
    assert gone["levels"] == [] and gone["seeds"] == []  # every rate of the ramp, on every seed it needs
    assert gone["robustness"] == []  # the reserve: both of the answer's burst checks ran
    assert sorted(t["stage"] for t in doc["trials"] if t["stage"] == "robustness") == ["robustness"] * 2
    refined = [c["flags"] for c in gone["configs"]]
    assert len(refined) == 3 and all(f != "-" for f in refined)
    assert not [t for t in doc["trials"] if t["stage"] == "refine"]
    assert gone["recommendation"]["differs"] is False
    assert "left out: 3 refinement configs; the same recommendation" in doc["budget"]
    assert "refinement configs not measured: --chunked-prefill-size 16384" in text.replace("\n", " ")


def test_the_answer_is_checked_before_the_refinement_which_stops_where_its_next_trial_would_not_fit(
        tmp_path: Path) -> None:
    """plans/gpu-h100-vlm-rate.yaml at 6.5 GPU min without the predictor: the ramp's answer is checked under bursts
    first, on the server that runs it; then one candidate fits, the next would not (its restart and trial beside
    the check a winner would still need), so the walk ends at the incumbent, says why and what it did not measure,
    and no restart back to the answer's flags is paid for a check that already ran."""
    from servetune.tuning.campaign import dry_run
    from servetune.tuning.runner import SimTrialRunner

    data = yaml.safe_load((PLANS / "gpu-h100-vlm-rate.yaml").read_text())
    data["budget"]["max_gpu_minutes"] = 6.5
    data["stages"]["refine"].pop("predict")
    path = tmp_path / "vlm-6min.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = load_plan(path)
    decision, outcomes, _ = dry_run(plan, SimTrialRunner.for_plan(plan), checklist=False)
    stages = [o.stage for o in outcomes]
    assert stages.count("refine") == 1 and stages.count("robustness") == 1
    assert stages.index("robustness") < stages.index("refine") and stages[-1] == "refine"  # checked first
    assert sum(o.gpu_seconds for o in outcomes) <= 6.5 * 60
    assert sum(o.restarted for o in outcomes) == 2  # the first start and the candidate's: none back
    rec = decision.recommendation
    assert rec is not None and rec.robustness and rec.robustness[0]["passed"] is not None
    assert rec.config.get("mm-processor-worker-num") is None  # the incumbent, the config the check measured
    text = " ".join(rec.explanation)
    assert "the refinement stopped: its next trial (about 1.8 GPU min) would end past the budget (5.4 of 6.5" in text
    assert "not measured: --mm-processor-worker-num" in text and "kept the incumbent" in text
    # with room for that trial but not for the check a winner would need after it, the reserve is what stops it
    data["budget"]["max_gpu_minutes"] = 7.3
    path.write_text(yaml.safe_dump(data))
    plan = load_plan(path)
    decision, outcomes, _ = dry_run(plan, SimTrialRunner.for_plan(plan), checklist=False)
    assert [o.stage for o in outcomes].count("refine") == 1 and decision.recommendation is not None
    assert ("would leave less than the 0.3 GPU min a winning candidate's robustness check needs (5.4 of 7.3 min"
            in " ".join(decision.recommendation.explanation))


def test_the_campaign_under_the_budget_is_read_off_the_unlimited_one_exactly(tmp_path: Path) -> None:
    """The dry run simulates the campaign once, without the budget, and reads the budgeted one off it: the
    same trials, GPU time and answer as simulating the budgeted campaign itself (demo plan, 3 GPU min: the
    budget runs out inside the refinement)."""
    from servetune.tuning.campaign import dry_run
    from servetune.tuning.runner import SimTrialRunner

    plan = load_plan(_with_budget(tmp_path, "demo", 3))
    calls: list[float] = []

    def run(p):
        calls.append(p.budget.max_gpu_minutes)
        return bv.DryRun(*dry_run(p, SimTrialRunner.for_plan(p), checklist=False))

    budgeted, whole = bv.dry_runs(plan, run)
    assert calls == [bv.LIFTED_MINUTES]  # simulated once
    real = run(plan)
    assert [bv.measures(s) for s in budgeted.specs] == [bv.measures(s) for s in real.specs]
    assert [o.gpu_seconds for o in budgeted.outcomes] == pytest.approx([o.gpu_seconds for o in real.outcomes])
    assert budgeted.decision.reason == real.decision.reason and "GPU budget spent" in real.decision.reason
    assert budgeted.decision.recommendation.config == real.decision.recommendation.config
    assert budgeted.decision.recommendation.concurrency == real.decision.recommendation.concurrency
    assert "refine" in {s.stage for s in real.specs} and len(whole.specs) > len(real.specs)
    fit = bv.budget_fit(plan, budgeted, whole)
    assert not fit.fits
    assert fit.stopped_at == {"trial": len(real.specs) + 1, "stage": whole.specs[len(real.specs)].stage}


def _outcome(stage: str, level: int, *, flags: dict | None = None, seed: int = 0, gpu_s: float = 30.0,
             restarted: bool = False) -> TrialOutcome:
    return TrialOutcome(trial_id=f"{stage}-{level}-{seed}-{len(flags or {})}", stage=stage, concurrency=level,
                        flags=flags or {}, seed_offset=seed, gpu_seconds=gpu_s, restarted=restarted)


def test_stage_rows_keep_start_ups_apart_and_a_failed_start_costs_its_start_only() -> None:
    outs = [_outcome("correctness", 1, gpu_s=92.0, restarted=True), _outcome("ramp", 8), _outcome("ramp", 8, seed=1),
            _outcome("refine", 8, flags={"chunked-prefill-size": 1024}, gpu_s=120.0, restarted=True),
            _outcome("refine", 8, flags={"mem-fraction-static": 0.05}, gpu_s=40.0, restarted=True)]  # refused start
    rows = {r.stage: r for r in bv.stage_rows(outs, restart_cost_s=90.0)}
    assert rows["correctness"].startup_s == 90.0 and rows["correctness"].trial_s == pytest.approx(2.0)
    assert (rows["ramp"].trials, rows["ramp"].seeds, rows["ramp"].configs, rows["ramp"].starts) == (2, 2, 1, 0)
    assert rows["refine"].startup_s == 90.0 + 40.0 and rows["refine"].trial_s == pytest.approx(30.0)
    assert rows["total"].configs == 3 and rows["total"].starts == 3
    assert rows["total"].trial_s + rows["total"].startup_s == pytest.approx(sum(o.gpu_seconds for o in outs))
    assert list(rows) == ["correctness", "ramp", "refine", "total"]


def test_flags_text_says_what_a_config_changes_from_the_plan() -> None:
    base = {"mem-fraction-static": 0.85, "enable-metrics": True}
    assert bv.flags_text(dict(base), base) == "-"
    assert bv.flags_text({**base, "chunked-prefill-size": 4096}, base) == "--chunked-prefill-size 4096"
    assert bv.flags_text({"mem-fraction-static": 0.85}, base) == "-enable-metrics"
    assert bv.flags_text({**base, "disable-radix-cache": True}, base) == "--disable-radix-cache"
