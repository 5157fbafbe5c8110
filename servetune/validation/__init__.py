"""servetune.validation: the report checklist (docs/warehouse.md) as Great Expectations suites.

``validate(result) -> ValidationReport``; the suites live in ``expectations/`` (packaged here as
``servetune/validation/expectations``).
"""

from servetune.validation.checklist import (
    EXPECTATIONS_DIR,
    SUITES,
    WAIVABLE,
    ExpectationOutcome,
    ValidationReport,
    validate,
)

__all__ = ["EXPECTATIONS_DIR", "SUITES", "WAIVABLE", "ExpectationOutcome", "ValidationReport", "validate"]
