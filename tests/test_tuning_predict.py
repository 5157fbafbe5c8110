"""The calibrated simulator in the loop (servetune.tuning.predict, plan ``refine.predict``): a refinement candidate
it predicts clearly worse than the incumbent is not measured, the answer stands, predictions are shown beside
what was measured; it abstains, measuring every candidate, without a simulator profile or when its held-out
error on the campaign's own trials is above ``max_error``."""

from __future__ import annotations

from pathlib import Path

import pytest

from servetune.plan import load_plan, parse_plan
from servetune.tuning.campaign import dry_run
from servetune.tuning.runner import SimTrialRunner
from test_tuning_decisions import make_plan, summary
from test_tuning_noise import drive

DEMO = Path(__file__).resolve().parents[1] / "plans" / "demo.yaml"
GRID = {"chunked-prefill-size": [64, 256, 4096], "schedule-conservativeness": [0.3, 1.0, 1.6]}


def _demo(predict: dict | None):
    data = load_plan(DEMO).model_dump(mode="json")
    data["stages"]["refine"].update(grid=GRID, predict=predict)
    plan = parse_plan(data, source="demo + grid")
    decision, outcomes, _ = dry_run(plan, SimTrialRunner(plan), checklist=False)
    return decision, outcomes


@pytest.mark.slow
def test_a_candidate_the_simulator_rules_out_is_not_measured_and_the_answer_stands() -> None:
    """Chunked prefill at 64 and 256 tokens: the simulator, calibrated on the campaign's own baseline and ramp,
    predicts them far below the defaults (64: -86%): not measured. The others it predicts a tie at best, which
    would keep the incumbent (they set more flags) with no level above where they serve more: not measured
    either. The answer is the one the full walk finds, for less GPU time; a candidate still measured shows its
    prediction beside its measurement."""
    full, full_trials = _demo(None)
    pruned, trials = _demo({})
    assert {("chunked-prefill-size", 64), ("chunked-prefill-size", 256)} <= {
        (k, v) for o in full_trials if o.stage == "refine" for k, v in o.flags.items()}  # the full walk measures them
    assert not [o for o in trials if o.flags.get("chunked-prefill-size") in (64, 256)]
    rec, ref = pruned.recommendation, full.recommendation
    assert rec is not None and ref is not None
    assert (rec.config, rec.concurrency) == (ref.config, ref.concurrency)
    lines = rec.explanation
    # after the ceiling
    assert lines[1].startswith("prediction: the simulator scaled x") and "held-out error" in lines[1]
    assert any(ln.startswith("chunked-prefill-size 64: not measured: predicted") and "beyond twice" in ln
               for ln in lines), lines
    assert any("not measured" in ln and "a tie at best, which keeps the incumbent" in ln for ln in lines), lines
    measured = {str(sorted(o.flags.items())) for o in trials if o.stage == "refine" and o.flags}
    shown = [ln for ln in lines if ": predicted " in ln and ", measured " in ln]
    assert len(shown) >= len(measured) - 1, (measured, shown)  # the tuned config carried up is no candidate
    assert sum(o.gpu_seconds for o in trials) < sum(o.gpu_seconds for o in full_trials)


REFINE = {"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
          "grid": {"schedule-conservativeness": [0.3]}, "predict": {}}


def test_no_profile_means_no_prediction_and_every_candidate_is_measured() -> None:
    """An SGLang plan without `estimate:`: the simulator has no profile for it, the walk says so and measures."""
    plan = make_plan(stages__refine=REFINE, repeats={"count": 1})
    d, asked = drive(plan, lambda flags, level, seed: summary(thr=level / 10 * (0.5 if flags else 1.0)))
    assert d.recommendation is not None
    assert [t.flags for t in asked if t.stage == "refine" and t.flags]  # the candidate was measured
    assert d.recommendation.explanation[1].startswith("prediction abstained: no simulator profile")


def test_a_calibration_that_misses_its_own_trials_abstains() -> None:
    """A sim plan whose engine behaves nothing like the simulator (goodput flat in the level where the model
    scales it): leave-one-out misses far beyond max_error, so nothing is ruled out."""
    plan = make_plan(stages__refine=REFINE, repeats={"count": 1},
                     engine={"kind": "sim", "model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G"},
                     stages__baseline={"concurrency": 8, "requests": 100},
                     stages__ramp={"levels": [16, 32, 64], "requests": 100, "bisect": False})
    bumpy = {8: 1.0, 16: 3.0, 32: 1.2, 64: 4.0}
    d, asked = drive(plan, lambda flags, level, seed: summary(thr=bumpy.get(level, 1.0) * (0.5 if flags else 1.0)))
    assert d.recommendation is not None
    line = next(ln for ln in d.recommendation.explanation if ln.startswith("prediction abstained"))
    assert "held-out error" in line and "above max_error 10%" in line, line
    assert [t for t in asked if t.stage == "refine" and t.flags.get("schedule-conservativeness") == 0.3]
