"""The notifier Variable: a bad one is one clear line; a good one builds Airflow's own notifiers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from servetune_airflow.alerts import LINE, NotifierConfigError, build, gpu_window, parse, past_its_window


@pytest.mark.parametrize(("raw", "says"), [
    ("[{notifier: 'smtp'}]", "servetune_notifiers: not JSON"),
    ('{"notifier": "smtp"}', "a JSON list of notifiers, got dict"),
    ('[{"to": "a@b.c"}]', 'servetune_notifiers[0]: an object with a "notifier"'),
    ('[{"notifier": "smtp", "args": ["a@b.c"]}]', "servetune_notifiers[0].args: an object"),
])
def test_a_bad_variable_is_one_line_naming_the_place(raw: str, says: str) -> None:
    with pytest.raises(NotifierConfigError) as err:
        parse(raw)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_short_names_build_the_providers_notifiers_with_servetunes_line() -> None:
    assert parse(None) == [] and parse("  ") == []
    (spec,) = parse('[{"notifier": "smtp", "args": {"to": "oncall@example.com", "subject": "mine"}}]')
    smtp = build(spec)
    assert type(smtp).__name__ == "SmtpNotifier" and smtp.to == "oncall@example.com"
    assert smtp.subject == "mine" and smtp.html_content == f"<p>{LINE}</p>"  # the operator's words win
    with pytest.raises(NotifierConfigError, match="pip install apache-airflow-providers-slack"):
        build({"notifier": "slack", "args": {}})  # not installed here: the line says what to install


@pytest.mark.parametrize(("raw", "minutes"), [("", None), ("  ", None), ("480", 480.0), ("1.5", 1.5),
                                              ("eight hours", None), ("0", None), ("-5", None)])
def test_the_gpu_window_is_read_from_the_environment_and_a_bad_one_sets_no_deadline(monkeypatch, raw, minutes):
    monkeypatch.setenv("SERVETUNE_GPU_WINDOW_MINUTES", raw)
    window = gpu_window()
    assert (window.total_seconds() / 60 if window else None) == minutes


def test_the_deadline_line_names_the_run_and_its_window_and_reaches_the_notifiers_message() -> None:
    (spec,) = parse('[{"notifier": "smtp", "args": {"to": "oncall@example.com"}}]')
    line = "servetune servetune_weekly week2: still running 480 min after it was queued"
    smtp = build(spec, line)
    assert smtp.subject == line and smtp.html_content == f"<p>{line}</p>"


def test_a_scheduled_run_that_starts_a_whole_window_after_its_tick_starts_nothing() -> None:
    """Airflow 3.3.2 runs the tick a paused DAG was parsed before at once when it is unpaused (seen: unpaused at
    04:55, the 04:00 run started); within the window it runs, past it the campaigns would hold the GPUs outside
    the team's window. Manual and asset-triggered runs, and a DAG without a window, always run."""
    tick, window = datetime(2026, 12, 7, 4, 0, tzinfo=UTC), timedelta(minutes=480)
    assert past_its_window("DagRunType.SCHEDULED", tick, tick + timedelta(minutes=55), window) is None
    late = past_its_window("DagRunType.SCHEDULED", tick, tick + timedelta(hours=8, minutes=5), window)
    assert late is not None and "due at 2026-12-07 04:00 UTC starts 485 min after it" in late
    assert "past its 480 min GPU window" in late and "trigger the DAG by hand" in late and "\n" not in late
    week_later = tick + timedelta(days=7)
    for run_type, w in (("manual", window), ("asset_triggered", window), ("scheduled", None)):
        assert past_its_window(run_type, tick, week_later, w) is None
