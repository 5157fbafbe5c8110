-- Every regression of the last days, with whether someone accepted the regressed answer since
-- (servetune.warehouse.acceptance): an unaccepted one keeps every later run of that service red.
-- @param days int = 30        how far back to look
-- @param model text = ''      a model, or '' for every model
-- psql: psql "$URL" -v days=30 -v model= -f sql/queries/regressions.sql
SELECT r.model,
       r.experiment_id,
       r.started_at,
       r.against_experiment_id,
       r.figure,
       r.why,
       a.accepted_by,
       a.reason AS accepted_because
FROM regressions r
LEFT JOIN acceptances a USING (experiment_id)
WHERE r.started_at >= now() - make_interval(days => CAST(:'days' AS int))
  AND (CAST(:'model' AS text) = '' OR r.model = :'model')
ORDER BY r.started_at DESC, r.experiment_id, r.figure;
