-- Trials the report checklist rejected in the last :days days, with the checks that failed.
-- @param days int = 30        how far back to look
-- @param model text = ''      a model, or '' for every model
-- psql: psql "$URL" -v days=30 -v model= -f sql/queries/rejected_trials.sql
SELECT t.model,
       t.experiment_id,
       t.trial_id,
       t.stage,
       t.concurrency,
       string_agg(v.checklist || ': ' || v.expectation || COALESCE('(' || v.column_name || ')', ''), '; '
                  ORDER BY v.seq) AS failed_checks
FROM trials t
JOIN validations v ON v.trial_id = t.trial_id AND NOT v.success
WHERE t.status = 'rejected'
  AND t.loaded_at >= now() - make_interval(days => CAST(:'days' AS int))
  AND (CAST(:'model' AS text) = '' OR t.model = :'model')
GROUP BY t.model, t.experiment_id, t.trial_id, t.stage, t.concurrency
ORDER BY t.model, t.experiment_id, t.concurrency NULLS LAST;
