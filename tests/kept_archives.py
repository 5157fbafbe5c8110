"""Kept GPU campaigns live in tests/data as .tar.xz (their trial files hold every request record): one way to
unpack them for a replay, shared by the tests that replay them."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import orjson

from servetune.plan import TuningPlan
from servetune.result import TrialResult
from servetune.tuning.plan_identity import check_same_plan
from servetune.tuning.state import CampaignState, TrialOutcome
from servetune.validation.campaign import apply_checklist


def unpack(root: Path, *archives: Path) -> Path:
    """Each archive unpacked into ``root`` (data-only: no links out, no device files); ``root`` back."""
    for archive in archives:
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    return root


def kept_state(folder: Path) -> CampaignState:
    """A kept campaign's state.json, read as the tuner reads it."""
    return CampaignState.model_validate_json((folder / "state.json").read_bytes())


def checklist_again(folder: Path, plan: TuningPlan) -> Iterator[tuple[TrialOutcome, TrialResult]]:
    """Each kept trial beside its result put through today's report checklist again (its stored verdict
    dropped first), so a replay test asserts that a change in the checklist reads the trials as they were read."""
    for o in kept_state(folder).outcomes:
        result = TrialResult.read(folder / "trials" / f"{o.trial_id}.json")
        result.validation = None
        yield o, apply_checklist(result, min_measured=plan.validation.min_measured)


def assert_read_as_kept(folder: Path, plan: TuningPlan) -> None:
    """The kept campaign ran this plan, and today's checklist rejects exactly the trials it rejected then."""
    check_same_plan(orjson.loads((folder / "experiment.json").read_bytes()), plan, folder)
    for o, again in checklist_again(folder, plan):
        assert (again.status == "rejected") == o.rejected, (o.stage, o.rate or o.concurrency, again.failure_reason)
