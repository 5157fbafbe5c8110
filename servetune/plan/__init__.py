"""The tuning plan: everything one campaign needs, loaded from YAML and checked before any server starts.

``model`` is the plan itself (``TuningPlan``), ``stages`` its protocol's steps, budget and validity rules,
``sections`` the optional ones (repeats, robustness, the dry run's profiles, the objective), ``load_section``
closed or open loop, ``protocols`` the one-off measurements beside a campaign, ``modality`` whether the model sees
images, ``reading`` the file or mapping to a plan.
"""

from servetune.engines.knobs import FlagValue
from servetune.numbers import MAX_NAME
from servetune.plan.load_section import LoadSection
from servetune.plan.model import TuningPlan
from servetune.plan.reading import PlanError, load_plan, parse_plan
from servetune.plan.stages import Budget, Level, Stages, ValidationSection

__all__ = ["MAX_NAME", "Budget", "FlagValue", "Level", "LoadSection", "PlanError", "Stages", "TuningPlan",
           "ValidationSection", "load_plan", "parse_plan"]
