-- Week-over-week prefix-cache hit rate per model and workload (a 60% -> 20% story).
-- A week is flagged `regressed` when the hit rate fell by at least 10 points AND by at least 20% of
-- the previous week's value, so ordinary drift (60% -> 57%) is not flagged. The prompt-template
-- fingerprints of both weeks sit beside it: a changed template is the usual cause.
CREATE OR REPLACE VIEW cache_hit_rate_weekly AS
WITH weekly AS (
    SELECT model, workload_fingerprint, week,
           avg(prefix_hit_rate) AS hit_rate,
           count(*) AS trials,
           string_agg(DISTINCT prompt_template_fingerprint, ',') AS prompt_template_fingerprints
    FROM accepted_trials
    WHERE prefix_hit_rate IS NOT NULL
    GROUP BY model, workload_fingerprint, week
), compared AS (
    SELECT w.*,
           lag(week) OVER win AS prev_week,
           lag(hit_rate) OVER win AS prev_hit_rate,
           lag(prompt_template_fingerprints) OVER win AS prev_prompt_template_fingerprints
    FROM weekly w
    WINDOW win AS (PARTITION BY model, workload_fingerprint ORDER BY week)
)
SELECT model, workload_fingerprint, week, hit_rate, trials, prompt_template_fingerprints,
       prev_week, prev_hit_rate, prev_prompt_template_fingerprints,
       prev_hit_rate - hit_rate AS hit_rate_drop,
       COALESCE(prev_hit_rate - hit_rate >= 0.10 AND hit_rate <= 0.8 * prev_hit_rate, false) AS regressed
FROM compared;

CREATE OR REPLACE VIEW cache_hit_regressions AS
SELECT * FROM cache_hit_rate_weekly WHERE regressed;
