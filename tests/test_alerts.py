"""The notifier Variable: a bad one is one clear line; a good one builds Airflow's own notifiers."""

from __future__ import annotations

import pytest

from servetune_airflow.alerts import LINE, NotifierConfigError, build, parse


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
