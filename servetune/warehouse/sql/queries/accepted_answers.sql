-- The answers later runs are compared with, newest first: who accepted each and why (servetune accept, or
-- servetune itself for a model's first answer and an unchanged one), and the finished answers still awaiting
-- a decision (accepted_by empty).
-- @param model text = ''      a model, or '' for every model
-- psql: psql "$URL" -v model= -f sql/queries/accepted_answers.sql
SELECT e.model,
       e.experiment_id,
       e.plan ->> 'name' AS plan,
       e.started_at,
       e.recommendation -> 'config' AS config,
       e.recommendation ->> 'concurrency' AS concurrency,
       e.recommendation ->> 'rate' AS rate,
       round((e.recommendation ->> 'goodput_rps')::numeric, 2) AS goodput_rps,
       a.accepted_by,
       a.accepted_at,
       a.reason
FROM experiments e
LEFT JOIN acceptances a USING (experiment_id)
WHERE e.status = 'done' AND e.recommendation IS NOT NULL
  AND (CAST(:'model' AS text) = '' OR e.model = :'model')
ORDER BY e.started_at DESC;
