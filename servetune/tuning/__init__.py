"""servetune.tuning: the staged protocol (docs/tuning.md) as pure decisions over trial results.

``next_trials(plan, state)`` says what to run next; a ``TrialRunner`` runs it (live or simulated);
``servetune.tuning.campaign`` drives the two and writes the result folder.
"""

from servetune.tuning.decisions import next_trials
from servetune.tuning.state import (
    CampaignState,
    Ceiling,
    Decision,
    Recommendation,
    TrialOutcome,
    TrialSpec,
    Verdict,
)

__all__ = [
    "CampaignState",
    "Ceiling",
    "Decision",
    "Recommendation",
    "TrialOutcome",
    "TrialSpec",
    "Verdict",
    "next_trials",
]
