-- Latency and throughput against load level for every accepted trial: the curves of each campaign.
CREATE OR REPLACE VIEW latency_vs_concurrency AS
SELECT model, experiment_id, week, experiment_started_at, stage, trial_id, load_mode, concurrency, request_rate,
       requests_measured, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms, tpot_p50_ms, tpot_p99_ms,
       e2e_p50_ms, e2e_p99_ms, request_throughput, output_tokens_per_s, goodput_rps, prefix_hit_rate,
       gpu_mem_peak_fraction, meets_sla, server_config
FROM accepted_trials;
