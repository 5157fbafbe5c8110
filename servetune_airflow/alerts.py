"""Who hears that a campaign failed: Airflow notifiers the operator configures, called on failure.

The ``outcome`` task fails (one line: ``campaign NAME failed: reason``) exactly when a campaign ended
without an answer, and its ``on_failure_callback`` is ``notify_failure``. That reads the Airflow Variable
``servetune_notifiers`` (UI, CLI, or ``AIRFLOW_VAR_SERVETUNE_NOTIFIERS``) when it fires, a JSON list of
Airflow notifiers, each by a short name or a class path, with its arguments:

    [{"notifier": "slack", "args": {"slack_conn_id": "slack_api_default", "channel": "#serving"}},
     {"notifier": "smtp", "args": {"to": "oncall@example.com", "from_email": "airflow@example.com"}},
     {"notifier": "my_pkg.alerts.PagerNotifier", "args": {...}}]

Credentials stay in Airflow connections (``slack_conn_id``, ``smtp_conn_id``), never in the Variable.
A notifier left without a message gets servetune's one line. A notifier that fails is logged and the
others still run: the task is already red. The same notifiers hear a weekly run that overruns its GPU window
(``deadline_missed``, the DAG's Airflow deadline alert); a scheduled run that would start past its window
starts nothing (``past_its_window``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from datetime import datetime, timedelta
from typing import Any

log = logging.getLogger(__name__)

VARIABLE = "servetune_notifiers"
SHORT = {
    "slack": "airflow.providers.slack.notifications.slack.SlackNotifier",
    "smtp": "airflow.providers.smtp.notifications.smtp.SmtpNotifier",
    "apprise": "airflow.providers.apprise.notifications.apprise.AppriseNotifier",
}
LINE = "servetune {{ dag.dag_id }} {{ run_id }}: {{ exception }}"
# the message argument of each short kind, filled with LINE unless the operator wrote one
MESSAGE = {"slack": {"text": LINE}, "smtp": {"subject": LINE, "html_content": "<p>" + LINE + "</p>"},
           "apprise": {"body": LINE, "title": "servetune"}}


class NotifierConfigError(ValueError):
    """The Variable does not describe a list of notifiers."""


def parse(raw: str | None) -> list[dict[str, Any]]:
    """The Variable's notifier specs, checked: ``[{"notifier": name-or-class-path, "args": {...}}, ...]``."""
    if not raw or not raw.strip():
        return []
    try:
        specs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise NotifierConfigError(f"{VARIABLE}: not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(specs, list):
        raise NotifierConfigError(f"{VARIABLE}: a JSON list of notifiers, got {type(specs).__name__}")
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("notifier"), str):
            raise NotifierConfigError(f"{VARIABLE}[{i}]: an object with a \"notifier\" (slack, smtp, apprise or a"
                                      " class path)")
        if not isinstance(spec.get("args", {}), dict):
            raise NotifierConfigError(f"{VARIABLE}[{i}].args: an object of the notifier's arguments")
    return specs


def build(spec: dict[str, Any], line: str = LINE) -> Any:
    """One notifier instance (an ``airflow.sdk.BaseNotifier``) from its spec; ``line`` its message unless the
    spec has one."""
    name = spec["notifier"]
    path = SHORT.get(name, name)
    module, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        hint = f" (pip install apache-airflow-providers-{name})" if name in SHORT else ""
        raise NotifierConfigError(f"{VARIABLE}: notifier {name!r} cannot be imported: {exc}{hint}") from None
    message = {k: v.replace(LINE, line) for k, v in MESSAGE.get(name, {}).items()}
    return cls(**{**message, **spec.get("args", {})})


def notify_failure(context: Any) -> None:
    """``on_failure_callback``: every configured notifier, each on its own."""
    _notify(context, LINE, "failure")


def gpu_window() -> timedelta | None:
    """How long a weekly run may take from being queued: ``SERVETUNE_GPU_WINDOW_MINUTES``, read when the DAG is
    parsed (set it for the scheduler and dag-processor: deploy/). Unset: no deadline, since Airflow 3.3.2's
    ``airflow dags test`` fails at the end of any run of a DAG that has one (it looks the alert up as a
    serialized row the test never wrote), and ``servetune demo`` runs ``dags test``."""
    raw = os.environ.get("SERVETUNE_GPU_WINDOW_MINUTES", "").strip()
    if not raw:
        return None
    try:
        minutes = float(raw)
    except ValueError:
        minutes = 0.0
    if minutes <= 0:
        log.error("SERVETUNE_GPU_WINDOW_MINUTES=%r is not a positive number of minutes: no deadline alert", raw)
        return None
    return timedelta(minutes=minutes)


def past_its_window(run_type: str, due: datetime | None, now: datetime, window: timedelta | None) -> str | None:
    """Why a scheduled run starts no campaign, or None: it starts a whole GPU window after its tick (a DAG paused
    over a tick runs the latest missed one at once when unpaused (catchup=False); or the scheduler was down),
    so its campaigns would take the GPUs outside the team's window. Manual and event runs always run."""
    if window is None or due is None or "scheduled" not in run_type.lower():
        return None
    late = now - due
    if late < window:
        return None
    return (f"the scheduled run due at {due:%Y-%m-%d %H:%M} UTC starts {late.total_seconds() / 60:.3g} min after"
            f" it, past its {window.total_seconds() / 60:g} min GPU window (SERVETUNE_GPU_WINDOW_MINUTES): no"
            " campaign started; trigger the DAG by hand to run it now")


def deadline_missed(context: dict[str, Any] | None = None, window_minutes: float = 0.0) -> None:
    """The weekly DAG's ``DeadlineAlert`` callback: the run is still going when its GPU window ends (a campaign
    slower than planned, a question nobody answered, a task stuck in a queue); every notifier hears it once."""
    run = (context or {}).get("dag_run") or {}
    line = (f"servetune {run.get('dag_id', '?')} {run.get('dag_run_id') or run.get('run_id', '?')}: still running"
            f" {window_minutes:g} min after it was queued: it overran its GPU window (SERVETUNE_GPU_WINDOW_MINUTES)")
    log.warning("%s", line)
    _notify(context or {}, line, "deadline")


def _notify(context: Any, line: str, what: str) -> None:
    from airflow.sdk import Variable

    try:
        specs = parse(Variable.get(VARIABLE, default=None))
    except NotifierConfigError as exc:
        log.error("no %s notification sent: %s", what, exc)
        return
    except PermissionError:  # Airflow 3.3.2: a deadline callback may read Variables from the environment only
        log.error("no %s notification sent: Airflow refused this callback the Variable %s from its metadata"
                  " database; set AIRFLOW_VAR_%s (and the notifiers' AIRFLOW_CONN_...) in the scheduler's"
                  " environment", what, VARIABLE, VARIABLE.upper())
        return
    for spec in specs:
        try:
            build(spec, line)(context)
            log.info("%s notified through %s", what, spec["notifier"])
        except Exception as exc:  # noqa: BLE001 - one broken notifier must not silence the others
            log.error("notifier %s failed: %s", spec["notifier"], exc)
