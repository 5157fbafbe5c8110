-- Latency and throughput against concurrency for one campaign (default: the model's latest).
-- @param model text = ''           the model (used when experiment_id is '')
-- @param experiment_id text = ''   a specific campaign
-- psql: psql "$URL" -v model=llama-8b -v experiment_id= -f sql/queries/latency_vs_concurrency.sql
WITH chosen AS (
    SELECT experiment_id
    FROM experiments
    WHERE (CAST(:'experiment_id' AS text) <> '' AND experiment_id = :'experiment_id')
       OR (CAST(:'experiment_id' AS text) = '' AND model = :'model')
    ORDER BY started_at DESC NULLS LAST
    LIMIT 1
)
SELECT l.experiment_id,
       l.stage,
       l.concurrency,
       l.request_rate,
       round(l.ttft_p50_ms::numeric, 1)          AS ttft_p50_ms,
       round(l.ttft_p99_ms::numeric, 1)          AS ttft_p99_ms,
       round(l.tpot_p99_ms::numeric, 2)          AS tpot_p99_ms,
       round(l.e2e_p99_ms::numeric, 1)           AS e2e_p99_ms,
       round(l.output_tokens_per_s::numeric, 1)  AS output_tokens_per_s,
       round(l.goodput_rps::numeric, 2)          AS goodput_rps,
       l.meets_sla
FROM latency_vs_concurrency l
JOIN chosen USING (experiment_id)
ORDER BY l.concurrency NULLS LAST, l.request_rate NULLS LAST, l.trial_id;
