"""The eighth window on real SGLang 0.5.17, one H100 (docs/gpu.md, "The eighth window"): the seed's VLM campaign
as a weekly run (its last answer did not hold, the full walk ran out of its 6 minutes), then the energy warm start
twice on the same machine, first with an empty kernel cache, then with the one the first left. Replayed from the
kept state, so a change in the rules that would read these trials differently fails here."""

from __future__ import annotations

import re
import tarfile
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from kept_archives import assert_read_as_kept, kept_state, unpack

from servetune.plan import load_plan
from servetune.result import TrialResult
from servetune.telemetry import startup_log
from servetune.tuning import next_trials

DATA = Path(__file__).resolve().parent / "data" / "gpu-h100-campaigns"
WINDOW = DATA / "2026-12-07c"
PLANS = {"tune-vlm": "gpu-h100-vlm-warm.yaml", "tune-c": "gpu-h100-energy-warm-kcache.yaml",
         "tune-c2": "gpu-h100-energy-warm-kcache.yaml"}


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    return unpack(tmp_path_factory.mktemp("gpu-h100-window8"), *(WINDOW / f"{n}.tar.xz" for n in PLANS),
                  DATA / "2026-12-06" / "tune-energy.tar.xz")  # (b): the energy answer both warm starts began from


@pytest.fixture(scope="module")
def previous_vlm(tmp_path_factory) -> dict:
    folder = unpack(tmp_path_factory.mktemp("vlm-before"), DATA / "2026-12-06c" / "tune-vlm.tar.xz")
    return orjson.loads((folder / "tune-vlm" / "recommendation.json").read_bytes())


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_kept_trial_gets_the_same_checklist_verdict_again(kept, name) -> None:
    assert_read_as_kept(kept / name, load_plan(WINDOW / PLANS[name]))


def test_the_vlm_answer_did_not_hold_and_the_walk_stopped_at_its_budget(kept, previous_vlm) -> None:
    """12 req/s passed on seeds 1 and 2 (p99 TPOT 33 and 38 ms against 40); seed 3 was rejected (one window),
    and its re-run failed at 40.04 ms. So the weekly run walked again from the baseline, and its 6 minutes ended at
    8 req/s on 2 seeds: a lower bound, said so, with what it left unmeasured."""
    folder, plan = kept / "tune-vlm", load_plan(WINDOW / PLANS["tune-vlm"])
    state = kept_state(folder)
    assert previous_vlm["rate"] == 12.0
    assert [(o.stage, o.rate, o.seed_offset, o.rejected) for o in state.outcomes[1:]] == [
        ("ramp", 12.0, 0, False), ("ramp", 12.0, 1, False), ("ramp", 12.0, 2, True), ("ramp", 12.0, 2, False),
        ("baseline", 4.0, 0, False), ("ramp", 8.0, 0, False), ("ramp", 8.0, 1, False)]
    assert state.outcomes[4].summary.tpot_ms.p99 == pytest.approx(40.04, abs=0.01)
    assert state.outcomes[4].summary.tpot_ms.p99 > plan.sla.p99_tpot_ms
    d = next_trials(plan, state, previous=previous_vlm)
    assert d.done and d.recommendation is not None and d.recommendation.rate == 8.0
    text = " ".join(d.recommendation.explanation)
    assert "GPU budget spent: 6.0 of 6 min" in text and "the answer stands on 2 of 3 seed(s)" in text
    assert "the robustness check" in text
    assert state.gpu_seconds == pytest.approx(360.5, abs=0.5) and state.startup_seconds == pytest.approx(155.9, abs=0.5)


def _spawn_to_ready(log: str) -> float:
    stamps = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f")
              for m in re.findall(r"^(\S+ \S+) INFO servetune\.runners\.lifecycle: (?:starting|sglang .* ready at)",
                                  log, re.M)]
    assert len(stamps) == 2, stamps
    return (stamps[1] - stamps[0]).total_seconds()


def test_a_second_start_on_the_machine_costs_half_and_the_kernel_cache_little_more(kept) -> None:
    """The text model's start: 126 s on a fresh machine (the seventh window; prefill graphs 65.4 s), 77 s after the
    VLM had started once on the same machine with an empty kernel cache of its own (prefill graphs 25.5 s), 69 s
    with the Triton cache that start left (97 files; prefill graphs 9.9 s)."""
    fresh = startup_log.read(DATA / "2026-12-07b" / "sglang-start.log")
    starts = {}
    for name in ("tune-c", "tune-c2"):
        folder = kept / name
        (first,) = [TrialResult.read(p) for p in (folder / "trials").glob("*.json") if TrialResult.read(p).stage
                    == "correctness"]
        starts[name] = (first.server["startup"], _spawn_to_ready((folder / f"{name}.log").read_text()))
    assert fresh["prefill_graphs_s"] == pytest.approx(65.4)
    assert starts["tune-c"][0]["prefill_graphs_s"] == pytest.approx(25.49)
    assert starts["tune-c2"][0]["prefill_graphs_s"] == pytest.approx(9.91)
    assert starts["tune-c"][1] == pytest.approx(76.7, abs=0.1) and starts["tune-c2"][1] == pytest.approx(69.2, abs=0.1)
    with tarfile.open(WINDOW / "logs.tar.xz") as tar:
        events = tar.extractfile("events.log").read().decode()
    assert "tune c: plan set: ; kernel caches in /tmp/kc before the start: /tmp/kc/triton=none" in events
    assert "tune c2: plan set: ; kernel caches in /tmp/kc before the start: /tmp/kc/triton=97f/3MB" in events


def test_the_energy_warm_start_costs_half_of_the_first_run_on_a_machine_that_started_the_engine_before(kept) -> None:
    """Both runs confirm (b)'s 64 streams on 3 seeds and fail 128 on its first, as every run did; 201 and 196 GPU s
    against (b)'s 384 (52% and 51%; the sixth window on a fresh machine: 63%). The trials alone are 40% of (b)'s,
    so the issue's 30% stays out of reach of a run that starts a server."""
    first = kept_state(kept / "tune-energy")
    previous = orjson.loads((kept / "tune-energy" / "recommendation.json").read_bytes())
    plan = load_plan(WINDOW / PLANS["tune-c"])
    for name, seconds in (("tune-c", 201.2), ("tune-c2", 196.2)):
        state = kept_state(kept / name)
        assert [(o.stage, o.concurrency, o.seed_offset) for o in state.outcomes] == [
            ("correctness", 1, 0), ("ramp", 64, 0), ("ramp", 64, 1), ("ramp", 64, 2), ("ramp", 128, 0)]
        d = next_trials(plan, state, previous=previous)
        assert d.done and d.recommendation is not None and d.recommendation.concurrency == 64
        assert state.server_starts == 1 and state.gpu_seconds == pytest.approx(seconds, abs=0.5)
        assert first.gpu_seconds == pytest.approx(384.2, abs=0.1)
        assert 0.50 < state.gpu_seconds / first.gpu_seconds < 0.53
        trials = (state.gpu_seconds - state.startup_seconds) / (first.gpu_seconds - first.startup_seconds)
        assert 0.38 < trials < 0.41
