"""Replays NVML samples taken on a real H100 (tests/data/gpu-h100-energy): servetune's energy over each phase
comes from the counter, agrees with the integrated power curve under steady load, and shows why the counter
is preferred (the power reading lags a change of load); the checklist's energy rows hold on real readings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servetune.energy import window_energy
from servetune.result import TrialResult
from servetune.validation.frames import gpu_frame

RUNS = sorted((Path(__file__).parent / "data" / "gpu-h100-energy" / "2026-12-05").glob("run*.json"))


@pytest.fixture(params=RUNS, ids=lambda p: p.stem)
def run(request) -> dict:
    return json.loads(request.param.read_text())


def test_the_counter_and_the_curve_agree_within_three_percent_under_steady_load(run) -> None:
    gpu, edge = run["gpu"], run["edge_s"]
    first_idle, small, big, after = run["phases"]
    for phase in (first_idle, small, big):
        e = window_energy(gpu, phase["start_s"] + edge, phase["end_s"] - edge)
        assert e is not None and e["method"] == "counter"
        assert e["curve_over_counter"] == pytest.approx(1.0, abs=0.03)
        assert e["joules"] == pytest.approx(phase["energy"]["joules"])  # what the device printed
    big_e = window_energy(gpu, big["start_s"] + edge, big["end_s"] - edge)
    assert big_e["mean_w"] == pytest.approx(700, rel=0.02)  # 8192-wide products hold the board at its limit
    assert 70 < window_energy(gpu, first_idle["start_s"] + edge, first_idle["end_s"] - edge)["mean_w"] < 80
    # the large products do more work per joule than the small ones, which leave the tensor cores waiting
    small_e = window_energy(gpu, small["start_s"] + edge, small["end_s"] - edge)
    per_joule = [p["flops"] / (p["end_s"] - p["start_s"]) / e["mean_w"] for p, e in ((small, small_e), (big, big_e))]
    assert per_joule[1] > 2 * per_joule[0]
    # right after the load stops the power reading still reads high: the curve overstates, the counter does not
    e = window_energy(gpu, after["start_s"] + edge, after["end_s"] - edge)
    assert e["curve_over_counter"] > 1.2
    assert e["joules"] == pytest.approx(e["gpus"][0]["joules_counter"])


def test_real_readings_pass_the_checklists_energy_rows(run) -> None:
    df = gpu_frame(TrialResult(gpu=run["gpu"]))
    assert df["energy_step_j"].min() >= 0  # the counter never went back
    assert df["power_headroom_w"].min() >= 0  # readings pass the 700 W limit, but by less than the 10% slack
    assert df["power_w"].max() > 700
