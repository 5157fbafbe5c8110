"""What the report checklist found on one trial, as data: kept with the result and stored in the warehouse.

The checklist itself (servetune.validation, Great Expectations) writes these; the warehouse and the
reports only read them, so the models live below both.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ExpectationOutcome(BaseModel):
    suite: str
    expectation: str
    column: str | None = None
    checklist: str | None = None
    success: bool
    observed_value: Any = None
    details: dict[str, Any] = {}


class ValidationReport(BaseModel):
    """What the checklist found; stored with the result and in the warehouse's ``validations``."""

    success: bool
    results: list[ExpectationOutcome]
    suites: list[str]
    gx_version: str
    parameters: dict[str, Any] = {}
    waived: list[str] = []
    data_docs: str | None = None  # index.html when Data Docs were built
    suites_digest: str | None = None  # sha256 of the suites' JSON as run: a stored report is reused only if equal

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [r for r in self.results if not r.success]

    def failure_reason(self) -> str | None:
        if self.success:
            return None
        items = sorted({f"{r.checklist or r.suite}: {r.expectation}({r.column or ''})" for r in self.failed})
        return "validation failed: " + "; ".join(items)
