-- The ceiling of each campaign: the highest concurrency whose accepted trial met the SLA,
-- with the throughput, latency and prefix-cache hit rate measured there.
CREATE OR REPLACE VIEW ceiling_history AS
SELECT DISTINCT ON (a.experiment_id)
       a.model, a.week, a.experiment_id, a.trigger, a.experiment_started_at,
       a.trial_id AS ceiling_trial_id, a.concurrency AS ceiling_concurrency,
       a.request_throughput, a.output_tokens_per_s, a.goodput_rps,
       a.ttft_p99_ms, a.tpot_p99_ms, a.e2e_p99_ms, a.prefix_hit_rate, a.gpu_mem_peak_fraction,
       a.server_config, a.workload_fingerprint, a.prompt_template_fingerprint, e.recommendation
FROM accepted_trials a
JOIN experiments e USING (experiment_id)
WHERE a.meets_sla AND a.concurrency IS NOT NULL
ORDER BY a.experiment_id, a.concurrency DESC, a.goodput_rps DESC NULLS LAST, a.trial_id;
