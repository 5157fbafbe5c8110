-- Trials that were measured ("ok") and passed the report checklist, with their campaign's context.
-- week: the Monday (UTC) of the campaign's start; meets_sla: the trial-level SLA judgement
-- (p99 bounds, falling back to the per-request bounds; error rate; GPU memory limit).
CREATE OR REPLACE VIEW accepted_trials AS
SELECT t.*,
       e.trigger,
       e.dag_run_id,
       e.model_fingerprint,
       e.prompt_template_fingerprint,
       e.started_at AS experiment_started_at,
       (date_trunc('week', COALESCE(e.started_at, t.started_at), 'UTC') AT TIME ZONE 'UTC')::date AS week,
       (
           (COALESCE(t.sla->>'p99_ttft_ms', t.sla->>'ttft_ms') IS NULL
                OR t.ttft_p99_ms <= COALESCE(t.sla->>'p99_ttft_ms', t.sla->>'ttft_ms')::float8)
           AND (COALESCE(t.sla->>'p99_tpot_ms', t.sla->>'tpot_ms') IS NULL
                OR t.tpot_p99_ms <= COALESCE(t.sla->>'p99_tpot_ms', t.sla->>'tpot_ms')::float8)
           AND (COALESCE(t.sla->>'p99_e2e_ms', t.sla->>'e2e_ms') IS NULL
                OR t.e2e_p99_ms <= COALESCE(t.sla->>'p99_e2e_ms', t.sla->>'e2e_ms')::float8)
           AND COALESCE(t.error_rate, 0) <= COALESCE((t.sla->>'max_error_rate')::float8, 0.01)
           AND (t.sla->>'gpu_memory_limit' IS NULL
                OR t.gpu_mem_peak_fraction <= (t.sla->>'gpu_memory_limit')::float8)
       ) IS TRUE AS meets_sla
FROM trials t
JOIN experiments e USING (experiment_id)
WHERE t.status = 'ok' AND t.validation_success IS TRUE;
