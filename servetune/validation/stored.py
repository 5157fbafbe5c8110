"""The same checklist suites on a trial already in the warehouse, through GX's Postgres datasource.

Each suite runs on a query asset that reproduces its pandas frame in SQL (the derived columns of
``frames.py`` included), so a stored trial can be re-checked after the suites change without the
result file. The trial id is quoted by psycopg (``sql.Literal``), never pasted in by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import func, select

from servetune.localdb import libpq_dsn
from servetune.result import TrialResult, TrialSummary
from servetune.validation.checklist import (
    ValidationReport,
    check_waivable,
    gx_context,
    parameters,
    run_batches,
    suites_for,
)
from servetune.validation.frames import POWER_LIMIT_SLACK
from servetune.warehouse import db
from servetune.warehouse.tables import gpu_samples, trials

_SUMMARY = """
SELECT t.input_len_p50, t.input_len_p90, t.input_len_p99, t.output_len_p50, t.output_len_p90, t.output_len_p99,
       t.ttft_p50_ms, t.ttft_p99_ms, t.itl_p50_ms, t.itl_p99_ms, t.tpot_p50_ms, t.tpot_p99_ms,
       t.decode_tokens_per_s, t.output_tokens_per_s, t.prefix_hit_rate, t.gpu_mem_peak_bytes,
       t.requests_measured, t.error_rate,
       t.window_source, t.window_s, t.completions_in_window, t.in_flight_min_fraction, t.dispatch_fraction,
       t.throughput_mismatch, t.request_throughput, t.goodput_rps,
       (t.summary_multimodal->>'image_token_share')::float8 AS image_token_share,
       (t.summary_multimodal->>'hit_rate_image_tokens')::float8 AS hit_rate_image_tokens,
       (t.summary_multimodal->>'hit_rate_text_tokens')::float8 AS hit_rate_text_tokens,
       (t.summary_multimodal->>'image_tokens_per_image_p50')::float8 AS image_tokens_per_image_p50,
       COALESCE(t.gpu_info->>'state', t.gpu_state) AS gpu_state,
       COALESCE(t.gpu_clean_at_start, CASE  -- servetune.gpu_summary.clean_at_start, the one rule, in SQL
         WHEN COALESCE(t.gpu_info->>'state', '') NOT IN ('ok', 'simulated')
              OR jsonb_typeof(t.gpu_info->'processes_at_start') IS DISTINCT FROM 'array' THEN NULL
         WHEN jsonb_path_exists(t.gpu_info, '$.processes_at_start[*] ? (@.foreign == true)') THEN false
         WHEN NOT jsonb_path_exists(t.gpu_info, '$.processes_at_start[*] ? (!(@.foreign == false))') THEN true
         END) AS gpu_clean_at_start,
       t.energy_method <> 'unavailable' AS energy_on_gpu,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY r.prompt_tokens::float8 / r.requested_input_tokens)
          FROM request_records r
         WHERE r.trial_id = t.trial_id AND NOT r.warmup AND r.error_class IS NULL AND r.turn = 0
           AND r.n_images = 0 AND r.requested_input_tokens > 0 AND r.prompt_tokens IS NOT NULL)
           AS input_len_vs_spec,
       (SELECT count(*) FROM request_records r
         WHERE r.trial_id = t.trial_id AND NOT r.warmup AND r.error_class IS NULL AND r.turn = 0
           AND r.n_images = 0) AS text_only_requests,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY r.completion_tokens::float8 / r.requested_output_tokens)
          FROM request_records r
         WHERE r.trial_id = t.trial_id AND NOT r.warmup AND r.error_class IS NULL
           AND r.requested_output_tokens > 0 AND r.completion_tokens IS NOT NULL)
           AS output_len_vs_spec,
       (SELECT GREATEST(0, min(g.t_s) - t.window_start_s) + GREATEST(0, t.window_end_s - max(g.t_s))
          FROM gpu_samples g WHERE g.trial_id = t.trial_id HAVING count(*) > 0) AS gpu_window_uncovered_s
FROM trials t WHERE t.trial_id = {trial_id}
"""
_REQUESTS = """
SELECT request_id, t_send_s, queue_ms, ttft_ms, e2e_ms, tpot_ms, prompt_tokens, completion_tokens, cached_tokens
FROM request_records WHERE trial_id = {trial_id} AND NOT warmup
"""
_GPU = """
SELECT g.t_s, g.gpu, g.mem_used, g.mem_total, g.util, g.power_w, g.energy_mj::float8 AS energy_mj,
       (g.t_s - lag(g.t_s) OVER w) * 1000.0 AS gap_ms,
       (g.energy_mj - lag(g.energy_mj) OVER w) / 1000.0 AS energy_step_j,
       (SELECT (d->>'power_limit_w')::float8 FROM trials t, jsonb_array_elements(t.gpu_info->'devices') d
         WHERE t.trial_id = g.trial_id AND (d->>'index')::int = g.gpu) * {slack} - g.power_w AS power_headroom_w
FROM gpu_samples g WHERE g.trial_id = {trial_id}
WINDOW w AS (PARTITION BY g.gpu ORDER BY g.t_s)
"""
_QUERIES = {"trial_summary": _SUMMARY, "trial_requests": _REQUESTS, "trial_gpu": _GPU}


def _stored_context(url: str, trial_id: str) -> tuple[TrialResult, float | None]:
    """What ``parameters`` needs (SLA, workload, GPU interval, the GPU curve's span) from the stored rows."""
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            row = conn.execute(
                select(trials.c.sla, trials.c.workload, trials.c.gpu_info, trials.c.lengths_exact,
                       trials.c.gpu_sample_interval_ms, trials.c.summary_validity_rules, trials.c.scenario,
                       trials.c.offered_concurrency, trials.c.in_flight_mean).where(trials.c.trial_id == trial_id)
            ).first()
            span = conn.execute(select(func.max(gpu_samples.c.t_s) - func.min(gpu_samples.c.t_s))
                                .where(gpu_samples.c.trial_id == trial_id)).scalar()
    finally:
        eng.dispose()
    if row is None:
        raise LookupError(f"no trial {trial_id!r} in the warehouse")
    return TrialResult(trial_id=trial_id, sla=row.sla or {}, workload=row.workload or {}, gpu=row.gpu_info or {},
                       summary=TrialSummary(lengths_exact=bool(row.lengths_exact),
                                            gpu_sample_interval_ms=row.gpu_sample_interval_ms,
                                            validity_rules=row.summary_validity_rules or {},
                                            scenario=row.scenario, offered_concurrency=row.offered_concurrency,
                                            in_flight_mean=row.in_flight_mean)), span


def validate_stored(trial_id: str, *, database_url: str | None = None, min_measured: int = 200,
                    expected_interval_ms: float | None = None, max_error_rate: float | None = None,
                    waive: tuple[str, ...] | list[str] = (), data_docs_dir: str | Path | None = None,
                    ) -> ValidationReport:
    """Check a loaded trial against the checklist, reading its rows through GX's Postgres datasource."""
    check_waivable(waive)
    url = db.resolve_url(database_url)
    context, span = _stored_context(url, trial_id)
    params = parameters(context, min_measured=min_measured, expected_interval_ms=expected_interval_ms,
                        max_error_rate=max_error_rate, span_s=span)
    with psycopg.connect(libpq_dsn(url)) as conn:
        literal = sql.Literal(trial_id).as_string(conn)
    waived = frozenset(waive)
    docs = Path(data_docs_dir) if data_docs_dir else None
    gx, ctx = gx_context(docs)
    source = ctx.data_sources.add_postgres("warehouse", connection_string=url)
    batches: dict[str, tuple[Any, dict[str, Any] | None]] = {
        name: (source.add_query_asset(name, query=_QUERIES[name].format(trial_id=literal, slack=POWER_LIMIT_SLACK))
               .add_batch_definition_whole_table("whole"), None)
        for name in suites_for(waived)
    }
    return run_batches(gx, ctx, batches, params, waive=waived, data_docs_dir=docs, run_name=f"stored:{trial_id}")
