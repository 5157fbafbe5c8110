-- What was the ceiling over the last :days days, with which prefix-cache hit rate?
-- @param model text           the model, as stored in experiments.model
-- @param days int = 31        how far back to look
-- psql: psql "$URL" -v model=llama-8b -v days=31 -f sql/queries/ceiling_last_month.sql
SELECT week,
       experiment_id,
       trigger,
       ceiling_concurrency,
       round(goodput_rps::numeric, 2)          AS goodput_rps,
       round(output_tokens_per_s::numeric, 1)  AS output_tokens_per_s,
       round(ttft_p99_ms::numeric, 1)          AS ttft_p99_ms,
       round(tpot_p99_ms::numeric, 2)          AS tpot_p99_ms,
       round(prefix_hit_rate::numeric, 3)      AS prefix_hit_rate
FROM ceiling_history
WHERE model = :'model'
  AND experiment_started_at >= now() - make_interval(days => CAST(:'days' AS int))
ORDER BY experiment_started_at;
