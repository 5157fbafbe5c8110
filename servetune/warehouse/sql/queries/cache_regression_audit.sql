-- The prefix-cache audit (diagnoses prefix_cache.*) of both weeks of each hit-rate regression (a 60% -> 20%):
-- one row per trial of the week before and the week of the fall, same model and workload.
-- @param model text = ''           a model, or '' for every model
-- psql: psql "$URL" -v model= -f sql/queries/cache_regression_audit.sql
SELECT r.model,
       r.workload_fingerprint,
       CASE WHEN a.week = r.week THEN 'regressed' ELSE 'before' END   AS side,
       a.week,
       round(r.prev_hit_rate::numeric, 3)                            AS prev_hit_rate,
       round(r.hit_rate::numeric, 3)                                 AS hit_rate,
       r.prev_prompt_template_fingerprints IS DISTINCT FROM r.prompt_template_fingerprints AS prompt_template_changed,
       a.trial_id,
       round(a.prefix_hit_rate::numeric, 3)                          AS trial_hit_rate,
       d.kind,
       d.severity,
       d.summary,
       d.evidence ->> 'likely_cause'                                 AS likely_cause,
       d.advice
FROM cache_hit_regressions r
JOIN accepted_trials a ON a.model = r.model
                      AND a.workload_fingerprint IS NOT DISTINCT FROM r.workload_fingerprint
                      AND a.week IN (r.prev_week, r.week)
LEFT JOIN diagnoses d ON d.trial_id = a.trial_id AND d.kind LIKE 'prefix\_cache.%'
WHERE (CAST(:'model' AS text) = '' OR r.model = :'model')
ORDER BY r.model, r.week, a.week, a.trial_id, d.kind;
