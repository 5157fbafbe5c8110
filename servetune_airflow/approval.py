"""The approval step of a campaign: an answer servetune did not accept by itself (a regression, other flags,
another level) waits here for a person, as Airflow's human-in-the-loop task; Approve does what
``servetune accept EXPERIMENT --why ...`` does (servetune.warehouse.acceptance), Reject leaves the last accepted
answer as the baseline. Nothing to decide (the model's first answer, the same answer again, a failed campaign):
the task skips itself at once.

The task waits in Airflow's ``awaiting_input`` state (no worker slot, no triggerer) for up to
``RESPONSE_TIMEOUT``; unanswered it fails, so the run is red and next week's run (``max_active_runs=1``) can start,
still compared with the last accepted answer. ``--conf {"approval": "off"}`` skips it (``servetune accept``
then decides), which ``airflow dags test`` needs: it waits for a response that only an api-server can take.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, ParamsDict
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

#: six days: an unanswered question ends before next Monday's run would queue behind it
RESPONSE_TIMEOUT = timedelta(days=6)


class AnswerApproval(ApprovalOperator):
    """Approve or reject a loaded answer as the new baseline; ``loaded`` is the load task's result."""

    template_fields = (*ApprovalOperator.template_fields, "loaded")

    def __init__(self, *, loaded: Any, **kwargs: Any) -> None:
        params = kwargs.pop("params", None)  # the DAG's, merged in by Airflow: the run's own
        params = params if isinstance(params, ParamsDict) else ParamsDict(params)
        # the one field the form asks for; Airflow validates every param when any task starts, so an empty
        # default must pass its schema: Approve without a reason is refused below instead
        params["why"] = Param("", type="string", source="task",
                              description="why this answer is the baseline now (kept in the warehouse, shown)")
        super().__init__(subject="servetune: accept this answer as the baseline?", response_timeout=RESPONSE_TIMEOUT,
                         params=params, **kwargs)
        self.loaded = loaded

    def execute(self, context: Any) -> Any:
        loaded = self._named(context)
        why_not = None
        if not loaded.get("awaits"):
            why_not = "nothing to decide: " + (f"accepted ({loaded['accepted']})" if loaded.get("accepted")
                                               else "no answer to accept")
        elif (context["params"].get("approval") or "ask") == "off":
            why_not = (f"approval off for this run: `servetune accept {loaded['experiment_id']} --why ...` decides"
                       f" ({loaded['awaits']})")
        if why_not:
            self.log.info("%s", why_not)  # Airflow logs only "Skipping task." for the exception
            raise AirflowSkipException(why_not)
        self.subject = f"servetune: accept {loaded.get('plan_name')}'s answer as the baseline?"
        self.body = (f"Experiment `{loaded['experiment_id']}` awaits acceptance: {loaded['awaits']}.\n\n"
                     "Approve (say why) makes it the baseline later runs are compared with; Reject keeps the last"
                     " accepted answer, and later runs stay red against it.")
        return super().execute(context)

    def _named(self, context: Any) -> dict[str, Any]:
        """The load's result; the mapped instance shows its plan's name (the group's ``map_index_template``)."""
        loaded = self.loaded or {}
        context["plan_name"] = loaded.get("plan_name") or loaded.get("experiment_id")
        return loaded

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from servetune.warehouse.acceptance import accept
        from servetune_airflow.config import warehouse_url

        ret = super().execute_complete(context, event)  # a new process: execute() did not run in this one
        exp_id = self._named(context).get("experiment_id")
        if ret["chosen_options"] == [self.APPROVE]:
            why = str(ret["params_input"].get("why") or "").strip()
            if not why:
                raise AirflowFailException(f"approved without a reason: {exp_id} is not accepted; say why in the"
                                           f" form, or run `servetune accept {exp_id} --why ...`")
            who = (ret.get("responded_by_user") or {}).get("name") or "airflow"
            done = accept(exp_id, why, by=f"{who} (Airflow)", database_url=warehouse_url())
            self.log.info("accepted %s as the baseline, by %s: %s", done.experiment_id, done.accepted_by,
                          done.reason)
        else:
            self.log.info("rejected: %s stays unaccepted; later runs compare with the last accepted answer", exp_id)
        return ret
