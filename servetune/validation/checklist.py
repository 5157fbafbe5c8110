"""Run the report checklist (Great Expectations 1.x suites from ``expectations/``) on one trial.

GX is called from our own code (airflow-provider-great-expectations does not install beside
Airflow 3.3), with an ephemeral context: nothing is written unless Data Docs are asked for.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

from servetune.checklist_report import ExpectationOutcome, ValidationReport
from servetune.result import TrialResult
from servetune.validation.frames import TrialFrames, build_frames
from servetune.validity import ValidityRules

log = logging.getLogger(__name__)

EXPECTATIONS_DIR = Path(__file__).with_name("expectations")
SUITES = ("trial_summary", "trial_requests", "trial_gpu")
#: checklist items a plan may waive (e.g. a CPU-only engine has no GPU memory curve)
WAIVABLE = frozenset({"gpu_memory_curve", "clean_gpu", "energy"})
#: the items about a measurement's steady window: a correctness check (one request, no load) has none
WINDOW_ITEMS = frozenset({"one_window", "steady_window", "window_completions"})


def check_waivable(waive: tuple[str, ...] | list[str]) -> None:
    """Refuse an item the checklist cannot waive, naming it and the ones it can (``--waive``, ``validation.waive``)."""
    unknown = sorted(set(waive) - WAIVABLE)
    if unknown:
        raise ValueError(f"--waive {', '.join(unknown)}: not a checklist item that can be waived "
                         f"({', '.join(sorted(WAIVABLE))})")
#: a GPU curve shorter than this many sampling intervals has no median cadence to check
CADENCE_TICKS = 5
#: a GPU state the suites accept: measured by NVML, or synthesized by the simulator
GPU_STATES_WITH_CURVE = ("ok", "simulated")
#: what each expectation returns: its observed value, counts and a sample of unexpected rows (all the report
#: keeps); SUMMARY's value counts double a trial's check and nothing reads them
RESULT_FORMAT = "BASIC"
#: trials one cached context checks before it is rebuilt (its in-memory store keeps every result)
RUNS_PER_CONTEXT = 200


@functools.cache
def suites_digest() -> str:
    """What the suites say, as run (read once a process): a stored report whose digest differs was made by
    other suites."""
    h = hashlib.sha256()
    for name in SUITES:
        h.update((EXPECTATIONS_DIR / f"{name}.json").read_bytes())
    return h.hexdigest()[:16]


def load_suite(name: str, waive: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A suite's JSON, minus the expectations of waived checklist items."""
    data = orjson.loads((EXPECTATIONS_DIR / f"{name}.json").read_bytes())
    data["expectations"] = [e for e in data["expectations"] if e.get("meta", {}).get("checklist") not in waive]
    return data


def trial_rules(result: TrialResult, rules: ValidityRules | None = None) -> ValidityRules:
    """The validity rules to check a trial against: the caller's, else the ones it was measured under."""
    if rules is not None:
        return rules
    stored = result.summary.validity_rules or {}
    return ValidityRules(**{k: v for k, v in stored.items() if k in ValidityRules.model_fields})


def curve_span_s(result: TrialResult) -> float | None:
    """Seconds between the GPU curve's first and last sample (None without samples)."""
    times = [x.get("t_s") for x in (result.gpu.get("samples") or []) if x.get("t_s") is not None]
    return max(times) - min(times) if times else None


def parameters(result: TrialResult, *, min_measured: int, expected_interval_ms: float | None,
               max_error_rate: float | None, rules: ValidityRules | None = None,
               span_s: float | None = None) -> dict[str, Any]:
    """Values for the suites' ``$PARAMETER`` placeholders, from the trial and the caller (``span_s``: the GPU
    curve's span where the samples are not in ``result``, as for a stored trial)."""
    rules = trial_rules(result, rules)
    s = result.summary
    level = s.offered_concurrency if s.scenario != "open_loop" else s.in_flight_mean
    interval = expected_interval_ms or result.gpu.get("interval_ms") or result.summary.gpu_sample_interval_ms
    interval = float(interval or 100.0)
    spec = (result.workload or {}).get("spec") or {}
    exact = bool(result.summary.lengths_exact or (result.workload or {}).get("lengths_exact"))
    if max_error_rate is None:
        max_error_rate = float((result.sla or {}).get("max_error_rate", 0.01))
    span = curve_span_s(result) if span_s is None else span_s
    # a sub-second check (the correctness trial) has two or three ticks between its start and stop samples:
    # their median gap says nothing of the cadence, so only the longest gap is held to it there
    short = span is not None and span * 1000.0 < CADENCE_TICKS * interval
    return {
        "min_measured": int(min_measured),
        "max_error_rate": float(max_error_rate),
        # prompts built with the model's tokenizer land within the chat template's overhead;
        # character-estimated prompts only within a factor of two
        "input_ratio_min": 0.8 if exact else 0.5,
        "input_ratio_max": 1.5 if exact else 2.0,
        # max_tokens caps the output; with ignore_eos the server generates exactly that many
        "output_ratio_min": 0.9 if spec.get("ignore_eos", True) else 0.0,
        "output_ratio_max": 1.05,
        "interval_min_ms": 0.0 if short else 0.5 * interval,
        "interval_max_ms": 1.5 * interval,
        "max_gap_ms": 5.0 * interval,
        "max_uncovered_s": 2.0 * interval / 1000.0 + 0.5,
        # servetune.validity: the steady window and what it must hold
        "min_window_s": rules.min_window_s,
        "min_completions": rules.completions_needed(level),
        "min_in_flight": rules.min_in_flight,
        "min_dispatch_fraction": rules.min_dispatch_fraction,
        "min_throughput_mismatch": -rules.max_throughput_mismatch,
        "max_throughput_mismatch": rules.max_throughput_mismatch,
    }


def _json_safe(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                                     default=str))


def _outcome(suite: str, r: dict[str, Any]) -> ExpectationOutcome:
    cfg = r["expectation_config"]
    kwargs = cfg.get("kwargs", {})
    res = r.get("result") or {}
    if "observed_value" in res:
        observed = res["observed_value"]
    else:
        observed = {k: res[k] for k in ("element_count", "unexpected_count", "partial_unexpected_list")
                    if k in res}
        if "partial_unexpected_list" in observed:
            observed["partial_unexpected_list"] = observed["partial_unexpected_list"][:10]
    exc = r.get("exception_info") or {}
    details = {k: v for k, v in kwargs.items() if k != "batch_id"}
    if exc.get("raised_exception"):
        details["exception"] = exc.get("exception_message")
    column = kwargs.get("column") or (
        f"{kwargs['column_A']}>={kwargs['column_B']}" if "column_A" in kwargs else None)
    return ExpectationOutcome(
        suite=suite, expectation=cfg["type"], column=column, checklist=(cfg.get("meta") or {}).get("checklist"),
        success=bool(r["success"]), observed_value=_json_safe(observed), details=_json_safe(details),
    )


def gx_context(data_docs_dir: Path | None = None) -> tuple[Any, Any]:
    """(gx module, an ephemeral context without analytics or progress bars[, with a Data Docs site])."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
    )
    ctx = gx.get_context(mode="ephemeral", project_config=config)
    if data_docs_dir is not None:
        ctx.add_data_docs_site("servetune", {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                              "base_directory": str(data_docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        })
    return gx, ctx


def suites_for(waive: frozenset[str]) -> list[str]:
    return [s for s in SUITES if not (s == "trial_gpu" and "gpu_memory_curve" in waive)]


def run_batches(gx: Any, ctx: Any, batches: dict[str, tuple[Any, dict[str, Any] | None]], params: dict[str, Any],
                *, waive: frozenset[str], data_docs_dir: Path | None, run_name: str) -> ValidationReport:
    """Run each suite on its batch (suite name -> (batch definition, batch parameters))."""
    definitions = _definitions(gx, ctx, {name: batch for name, (batch, _) in batches.items()}, waive, run_name)
    runs = {name: (definitions[name], parameters) for name, (_, parameters) in batches.items()}
    return _run(gx, ctx, runs, params, waive=waive, data_docs_dir=data_docs_dir, run_name=run_name)


def _definitions(gx: Any, ctx: Any, batches: dict[str, Any], waive: frozenset[str], run_name: str) -> dict[str, Any]:
    """A validation definition per suite (its expectations less the waived items) on its batch definition."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    return {name: ctx.validation_definitions.add(gx.ValidationDefinition(
        name=f"{run_name}:{name}", data=batch, suite=ctx.suites.add(ExpectationSuite(**load_suite(name, waive)))))
        for name, batch in batches.items()}


def _run(gx: Any, ctx: Any, runs: dict[str, tuple[Any, dict[str, Any] | None]], params: dict[str, Any], *,
         waive: frozenset[str], data_docs_dir: Path | None, run_name: str) -> ValidationReport:
    outcomes: list[ExpectationOutcome] = []
    for name, (definition, batch_parameters) in runs.items():
        run_kwargs = {"batch_parameters": batch_parameters, "expectation_parameters": params}
        if data_docs_dir is not None:  # a checkpoint stores the result so Data Docs can render it
            checkpoint = ctx.checkpoints.add(gx.Checkpoint(name=f"{run_name}:{name}",
                                                           validation_definitions=[definition]))
            vr = next(iter(checkpoint.run(**run_kwargs).run_results.values()))
        else:
            vr = definition.run(**run_kwargs, result_format=RESULT_FORMAT)
        outcomes.extend(_outcome(name, r) for r in vr.to_json_dict()["results"])
    docs = None
    if data_docs_dir is not None:
        ctx.build_data_docs(site_names=["servetune"])
        docs = str(Path(data_docs_dir) / "index.html")
    return ValidationReport(
        success=all(o.success for o in outcomes), results=outcomes, suites=list(runs),
        gx_version=gx.__version__, parameters=params, waived=sorted(waive), data_docs=docs,
        suites_digest=suites_digest(),
    )


class _Checker:
    """An ephemeral context holding the suites (less one set of waived items) on whole-dataframe batches, built
    once a process: each trial then passes only its frames (a campaign checks every trial as it finishes)."""

    def __init__(self, waive: frozenset[str]) -> None:
        self.gx, self.ctx = gx_context()
        source = self.ctx.data_sources.add_pandas(name="trial")
        batches = {name: source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("whole")
                   for name in suites_for(waive)}
        self.definitions = _definitions(self.gx, self.ctx, batches, waive, "trial")
        self.runs = 0


_checkers: dict[frozenset[str], _Checker] = {}
_checkers_lock = threading.Lock()


def _checker(waive: frozenset[str]) -> _Checker:
    """The process's checker for ``waive``, rebuilt after RUNS_PER_CONTEXT trials."""
    checker = _checkers.get(waive)
    if checker is None or checker.runs >= RUNS_PER_CONTEXT:
        checker = _checkers[waive] = _Checker(waive)
    checker.runs += 1
    return checker


def run_suites(frames: TrialFrames, params: dict[str, Any], *, waive: frozenset[str] = frozenset(),
               data_docs_dir: Path | None = None, run_name: str = "trial") -> ValidationReport:
    """The suites on a trial's pandas frames (whole-dataframe batches); Data Docs get a context of their own."""
    frame_of = {"trial_summary": frames.summary, "trial_requests": frames.requests, "trial_gpu": frames.gpu}
    if data_docs_dir is None:
        with _checkers_lock:  # a GX context is not thread-safe: a process checks one trial at a time
            c = _checker(waive)
            runs = {name: (d, {"dataframe": frame_of[name]}) for name, d in c.definitions.items()}
            return _run(c.gx, c.ctx, runs, params, waive=waive, data_docs_dir=None, run_name=run_name)
    gx, ctx = gx_context(data_docs_dir)
    source = ctx.data_sources.add_pandas(name="trial")
    batches = {
        name: (source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("whole"),
               {"dataframe": frame_of[name]})
        for name in suites_for(waive)
    }
    return run_batches(gx, ctx, batches, params, waive=waive, data_docs_dir=data_docs_dir, run_name=run_name)


def checklist_inputs(result: TrialResult, *, min_measured: int = 200, waive: tuple[str, ...] | list[str] = (),
                     expected_interval_ms: float | None = None, max_error_rate: float | None = None,
                     rules: ValidityRules | None = None) -> tuple[dict[str, Any], frozenset[str]]:
    """The parameters and skipped items ``validate`` runs ``result`` with. A correctness trial is a check, not
    a measurement: its own request count is the floor and the window items are waived for it."""
    check_waivable(waive)
    skipped = frozenset(waive)
    if result.stage == "correctness":
        min_measured = max(1, result.summary.requests_measured)
        skipped |= WINDOW_ITEMS
    return parameters(result, min_measured=min_measured, expected_interval_ms=expected_interval_ms,
                      max_error_rate=max_error_rate, rules=rules), skipped


def stored_report(result: TrialResult, *, min_measured: int = 200,
                  waive: tuple[str, ...] | list[str] = ()) -> ValidationReport | None:
    """The report already stored in ``result`` when these suites ran it with these parameters, else None:
    the campaign checked each trial as it finished, and the ``validate`` task need not check it again."""
    if not result.validation:
        return None
    stored = ValidationReport.model_validate(result.validation)
    params, skipped = checklist_inputs(result, min_measured=min_measured, waive=waive)
    same = (stored.suites_digest == suites_digest() and stored.gx_version == version("great_expectations")
            and stored.waived == sorted(skipped) and _json_safe(params) == stored.parameters)
    return stored if same else None


def validate(result: TrialResult, *, min_measured: int = 200, expected_interval_ms: float | None = None,
             max_error_rate: float | None = None, waive: tuple[str, ...] | list[str] = (),
             data_docs_dir: str | Path | None = None, rules: ValidityRules | None = None) -> ValidationReport:
    """Check one trial against the report checklist; ``waive`` drops checklist items a plan waived;
    ``rules`` (default: those the trial was measured under) bound the steady-window checks
    (``checklist_inputs``: a correctness trial is judged as a check; the report lists what was waived)."""
    params, skipped = checklist_inputs(result, min_measured=min_measured, waive=waive, rules=rules,
                                       expected_interval_ms=expected_interval_ms, max_error_rate=max_error_rate)
    report = run_suites(build_frames(result), params, waive=skipped,
                        data_docs_dir=Path(data_docs_dir) if data_docs_dir else None,
                        run_name=result.trial_id)
    log.info("trial %s: validation %s (%d/%d expectations met)", result.trial_id,
             "passed" if report.success else "FAILED", sum(o.success for o in report.results),
             len(report.results))
    return report
