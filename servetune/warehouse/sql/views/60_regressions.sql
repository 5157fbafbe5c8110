-- Every figure a campaign's answer lost against the last accepted answer of the same service, beyond
-- its noise (servetune.tuning.regressions, kept in the recommendation's diff_from_previous): one row each.
-- The Grafana alert rule "servetune regression" counts the week's rows.
CREATE OR REPLACE VIEW regressions AS
SELECT e.experiment_id,
       e.model,
       e.trigger,
       e.started_at,
       e.recommendation -> 'diff_from_previous' -> 'against' ->> 'experiment_id' AS against_experiment_id,
       r ->> 'figure' AS figure,
       (r ->> 'old')::double precision AS old_value,
       (r ->> 'new')::double precision AS new_value,
       (r ->> 'change')::double precision AS change,
       (r ->> 'threshold')::double precision AS threshold,
       r ->> 'unit' AS unit,
       r ->> 'why' AS why
FROM experiments e
CROSS JOIN LATERAL jsonb_array_elements(
    COALESCE(e.recommendation -> 'diff_from_previous' -> 'regressions', '[]'::jsonb)) AS r;
