-- The best accepted configuration of each week (highest goodput meeting the SLA).
-- @param model text           the model
-- @param weeks int = 12       how many weeks back
-- psql: psql "$URL" -v model=llama-8b -v weeks=12 -f sql/queries/best_config_history.sql
SELECT week,
       concurrency,
       server_config->>'chunked_prefill_size'      AS chunked_prefill_size,
       server_config->>'schedule_conservativeness' AS schedule_conservativeness,
       server_config->>'max_running_requests'      AS max_running_requests,
       round(goodput_rps::numeric, 2)              AS goodput_rps,
       round(ttft_p99_ms::numeric, 1)              AS ttft_p99_ms,
       round(prefix_hit_rate::numeric, 3)          AS prefix_hit_rate,
       trial_id
FROM best_config_weekly
WHERE model = :'model'
  AND week >= (now() - make_interval(weeks => CAST(:'weeks' AS int)))::date
ORDER BY week;
