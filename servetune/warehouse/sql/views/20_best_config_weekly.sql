-- The best accepted configuration per model per week: highest goodput among trials meeting the SLA.
CREATE OR REPLACE VIEW best_config_weekly AS
SELECT DISTINCT ON (model, week)
       model, week, experiment_id, trial_id, stage, server_config, load_mode, concurrency, request_rate,
       goodput_rps, request_throughput, output_tokens_per_s, ttft_p99_ms, tpot_p99_ms, e2e_p99_ms,
       prefix_hit_rate, gpu_mem_peak_fraction, workload_fingerprint, prompt_template_fingerprint
FROM accepted_trials
WHERE meets_sla
ORDER BY model, week, goodput_rps DESC NULLS LAST, output_tokens_per_s DESC NULLS LAST, trial_id;
