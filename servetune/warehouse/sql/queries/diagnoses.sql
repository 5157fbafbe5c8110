-- Diagnoses (servetune.diagnose) of the trials of an experiment, or of one trial: most severe first.
-- @param experiment text = ''    an experiment (campaign) id, or '' for every experiment
-- @param trial text = ''         a trial id, or '' for every trial
-- @param min_severity text = 'info'  info | warning | critical: the least severe finding to list
-- psql: psql "$URL" -v experiment=EXPERIMENT_ID -v trial= -v min_severity=info -f sql/queries/diagnoses.sql
SELECT t.experiment_id,
       d.trial_id,
       t.stage,
       t.load_mode,
       t.concurrency,
       t.request_rate,
       d.severity,
       d.kind,
       d.summary,
       d.advice,
       d.evidence
FROM diagnoses d
JOIN trials t ON t.trial_id = d.trial_id
WHERE (CAST(:'experiment' AS text) = '' OR t.experiment_id = :'experiment')
  AND (CAST(:'trial' AS text) = '' OR d.trial_id = :'trial')
  AND array_position(ARRAY['info', 'warning', 'critical'], d.severity)
      >= array_position(ARRAY['info', 'warning', 'critical'], CAST(:'min_severity' AS text))
ORDER BY t.experiment_id, t.concurrency NULLS LAST, t.request_rate NULLS LAST, d.trial_id,
         array_position(ARRAY['critical', 'warning', 'info'], d.severity), d.kind;
