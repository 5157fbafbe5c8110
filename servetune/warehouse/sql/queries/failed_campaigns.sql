-- Campaigns that ended without an answer (failed, interrupted), newest first, with their one-line reason.
-- @param days int = 30        how far back to look
-- @param model text = ''      a model, or '' for every model
-- psql: psql "$URL" -v days=30 -v model= -f sql/queries/failed_campaigns.sql
SELECT e.model,
       e.experiment_id,
       e.plan ->> 'name' AS plan,
       e.trigger,
       e.status,
       e.started_at,
       e.failure_reason,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.experiment_id) AS trials
FROM experiments e
WHERE e.status IN ('failed', 'interrupted')
  AND e.started_at >= now() - make_interval(days => CAST(:'days' AS int))
  AND (CAST(:'model' AS text) = '' OR e.model = :'model')
ORDER BY e.started_at DESC;
