-- The SGLang scheduler's own account of each trial of a campaign, from its batch log lines
-- (log_read false: the server's log was not read for that trial, so its counts say nothing).
-- @param experiment text      the experiment (campaign) id
-- psql: psql "$URL" -v experiment=EXPERIMENT_ID -f sql/queries/scheduler_batches.sql
SELECT t.trial_id,
       t.stage,
       t.concurrency,
       COALESCE(t.server_info ? 'scheduler_log', false)                          AS log_read,
       count(b.seq) FILTER (WHERE b.kind = 'prefill')                            AS prefill_batches,
       count(b.seq) FILTER (WHERE b.kind = 'decode')                             AS decode_lines,
       round((avg(b.running_req) FILTER (WHERE b.kind = 'decode'))::numeric, 1) AS decode_batch_mean,
       max(b.queue_req)                                                          AS queue_max,
       round(max(b.token_usage)::numeric, 3)                                     AS token_usage_max,
       -- cached / (new + cached) prompt tokens over the prefill batches, as TrialSummary.sched_cache_hit_rate
       round((sum(COALESCE(b.cached_token, 0)) FILTER (WHERE b.kind = 'prefill'))::numeric
             / NULLIF(sum(COALESCE(b.new_token, 0) + COALESCE(b.cached_token, 0))
                      FILTER (WHERE b.kind = 'prefill'), 0), 3)                  AS cache_hit_rate
FROM trials t
LEFT JOIN scheduler_batches b ON b.trial_id = t.trial_id
WHERE t.experiment_id = :'experiment'
GROUP BY t.trial_id  -- the primary key: the other trial columns follow from it
ORDER BY t.concurrency NULLS LAST, t.trial_id;
