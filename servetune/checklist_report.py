"""What the report checklist found on one trial, as data: kept with the result and stored in the warehouse.

The checklist itself (servetune.validation, Great Expectations) writes these; the warehouse and the
reports only read them, so the models live below both.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

_DETAIL = re.compile(r"\[([^\[\]]*)\]\s*$")  # the bracketed "item: expectation(column); ..." that ends a reason

#: each checklist item's failure in plain words (a reader's sentence; the item and its column are the detail)
PLAIN: dict[str, str] = {
    "length_distribution": "the lengths the server saw are not the ones the workload asked for",
    "prefill_decode": "TTFT, ITL or TPOT is missing, so prefill and decode cannot be told apart",
    "throughput": "no decode or output throughput was measured",
    "prefix_hit_rate": "the prefix-cache hit rate is missing or impossible (cached tokens over the prompt)",
    "gpu_memory_curve": "the GPU memory curve is missing or has holes (no sample at every interval of the window)",
    "clean_gpu": "the GPU was not clean at the start (another process held its memory)",
    "measured_requests": "too few requests were measured to quote a p99",
    "steady_window": "the load never held steady, so no window measures the server under one load",
    "window_completions": "too few requests completed inside the steady window",
    "in_flight_level": "the client did not hold the load it states (fewer in flight than streams, or arrivals late)",
    "one_window": "throughput and goodput do not come from one window (their figures disagree)",
    "error_rate": "too many requests failed",
    "images": "the image token counts are impossible (image tokens or their cache hits out of range)",
    "energy": "the energy over the window is missing or impossible (counter went back, or power over the limit)",
    "sanity_timings": "some timings are impossible (negative, or a first token after the last)",
}
#: a sharper sentence where one column says more than its item
PLAIN_COLUMN: dict[tuple[str, str], str] = {
    ("steady_window", "window_source"): "static batches fill and drain, so the load never held steady and no"
                                        " window measures the server under one load",
    ("steady_window", "window_s"): "the steady window is too short to quote its figures",
}


def plain_words(failed: list[tuple[str | None, str | None]]) -> list[str]:
    """The plain sentences for failed (checklist item, column) pairs, each once, in the items' order."""
    out: list[str] = []
    for item, column in failed:
        text = PLAIN_COLUMN.get((item or "", column or "")) or PLAIN.get(item or "") or f"checklist item {item} failed"
        if text not in out:
            out.append(text)
    return out


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
        failed = sorted(self.failed, key=lambda r: (r.checklist or r.suite, r.column or ""))
        items = sorted({f"{r.checklist or r.suite}: {r.expectation}({r.column or ''})" for r in failed})
        plain = plain_words([(r.checklist, r.column) for r in failed])
        return f"validation failed: {'; '.join(plain)} [{'; '.join(items)}]"

    def plain(self) -> list[str]:
        """Why the checklist rejected it, in plain words ([] when it passed)."""
        return plain_words([(r.checklist, r.column) for r in self.failed])


def items_in(reason: str | None) -> list[str]:
    """The checklist items a ``CheckReport.failure_reason()`` names, once each in order (read back from its
    bracketed detail): what a campaign that accepted nothing says it was rejected for."""
    m = _DETAIL.search(reason or "")
    return list(dict.fromkeys(part.split(":", 1)[0].strip() for part in m[1].split("; ") if ":" in part)) if m else []
