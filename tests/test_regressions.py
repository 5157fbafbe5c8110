"""Regression rules: a fall beyond the noise of the two campaigns is a regression, inside it is not."""

from __future__ import annotations

import pytest

from servetune.tuning.regressions import regressions

OLD = {"concurrency": 64, "rate": None, "goodput_rps": 10.0, "p99_ttft_ms": 800.0, "p99_tpot_ms": 40.0,
       "prefix_hit_rate": 0.60, "goodput_cv": None}


def test_each_figure_regresses_the_bad_way_beyond_its_floor() -> None:
    new = {**OLD, "concurrency": 48, "goodput_rps": 9.0, "p99_ttft_ms": 900.0, "p99_tpot_ms": 43.0,
           "prefix_hit_rate": 0.50}
    found = {r["figure"]: r for r in regressions(OLD, new)}
    # goodput -10% and the ceiling 64 -> 48 (-25%) beyond 5%; TTFT +12.5% beyond 10%; TPOT +7.5% is not;
    # the hit rate lost 10 points, beyond 5
    assert set(found) == {"goodput_rps", "capacity", "p99_ttft_ms", "prefix_hit_rate"}
    assert found["goodput_rps"]["change"] == pytest.approx(-0.10) and found["goodput_rps"]["threshold"] == 0.05
    assert found["prefix_hit_rate"]["unit"] == "points" and found["prefix_hit_rate"]["change"] == pytest.approx(-0.10)
    assert "10 -> 9 (-10.0%, beyond the 5.0% threshold)" in found["goodput_rps"]["why"]
    better = {**OLD, "goodput_rps": 12.0, "p99_ttft_ms": 500.0, "concurrency": 96, "prefix_hit_rate": 0.7}
    assert regressions(OLD, better) == []


def test_the_threshold_widens_with_the_campaigns_own_noise() -> None:
    """-10% goodput: a regression when each campaign's seeds agreed within 2% (threshold 5.7%), not when they spread
    by 6% (2 x sqrt(0.06^2 + 0.06^2) = 17% > 10%)."""
    new = {**OLD, "goodput_rps": 9.0}
    steady = regressions({**OLD, "goodput_cv": 0.02}, {**new, "goodput_cv": 0.02})
    assert [r["figure"] for r in steady] == ["goodput_rps"]
    assert steady[0]["threshold"] == pytest.approx(0.0566, abs=1e-4)
    assert regressions({**OLD, "goodput_cv": 0.06}, {**new, "goodput_cv": 0.06}) == []


def test_different_services_or_units_are_never_a_regression() -> None:
    worse = {**OLD, "goodput_rps": 5.0}
    assert regressions({**OLD, "changed": ["workload"]}, worse) == []  # not like for like: shown, not judged
    assert regressions(OLD, {**worse, "rate": 3.0}) == []  # a capacity in req/s against a ceiling in streams
    assert [r["figure"] for r in regressions({**OLD, "rate": 4.0}, {**worse, "rate": 3.0})] == ["goodput_rps",
                                                                                                 "capacity"]
