-- Weeks whose prefix-cache hit rate fell against the week before (a 60% -> 20%).
-- @param model text = ''           a model, or '' for every model
-- @param min_drop float = 0.10     smallest fall (absolute, 0..1) to report
-- @param min_relative float = 0.20 smallest fall relative to the previous week
-- psql: psql "$URL" -v model= -v min_drop=0.10 -v min_relative=0.20 -f sql/queries/cache_hit_regressions.sql
SELECT model,
       workload_fingerprint,
       prev_week,
       week,
       round(prev_hit_rate::numeric, 3) AS prev_hit_rate,
       round(hit_rate::numeric, 3)      AS hit_rate,
       round(hit_rate_drop::numeric, 3) AS hit_rate_drop,
       prev_prompt_template_fingerprints IS DISTINCT FROM prompt_template_fingerprints AS prompt_template_changed
FROM cache_hit_rate_weekly
WHERE (CAST(:'model' AS text) = '' OR model = :'model')
  AND hit_rate_drop >= CAST(:'min_drop' AS float8)
  AND hit_rate <= (1 - CAST(:'min_relative' AS float8)) * prev_hit_rate
ORDER BY week, model;
