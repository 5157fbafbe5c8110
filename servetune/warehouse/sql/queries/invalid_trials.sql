-- Trials whose measurement decides nothing (servetune.validity): no steady window, too few completions,
-- a client that could not hold the load, or token and request throughput that disagree.
-- @param days int = 30        how far back to look
-- @param model text = ''      a model, or '' for every model
-- psql: psql "$URL" -v days=30 -v model= -f sql/queries/invalid_trials.sql
SELECT t.model,
       t.experiment_id,
       t.trial_id,
       t.stage,
       t.scenario,
       t.concurrency,
       t.request_rate,
       round(t.window_s::numeric, 2) AS window_s,
       t.completions_in_window,
       t.completions_needed,
       round(t.in_flight_mean::numeric, 1) AS in_flight_mean,
       t.summary_invalid_reasons AS reasons
FROM trials t
WHERE t.valid IS FALSE
  AND t.loaded_at >= now() - make_interval(days => CAST(:'days' AS int))
  AND (CAST(:'model' AS text) = '' OR t.model = :'model')
ORDER BY t.model, t.experiment_id, t.concurrency NULLS LAST;
