-- Energy and cost against load level for every accepted trial: J per output token and per request, power,
-- and the plan's price per million tokens and per 1,000 good requests (servetune.energy). energy_method says
-- how the joules were found: counter (NVML's total energy), power_curve (integrated) or modelled (simulator).
-- needs column: trials.energy_j
CREATE OR REPLACE VIEW energy_vs_level AS
SELECT model, experiment_id, week, experiment_started_at, stage, trial_id, load_mode, concurrency, request_rate,
       server_config, energy_method, energy_j, energy_per_output_token_j, energy_per_request_j,
       gpu_power_window_mean_w, gpu_power_peak_w, energy_curve_over_counter,
       goodput_rps / NULLIF(gpu_power_window_mean_w, 0) * 1000.0 AS good_requests_per_kj,
       cost_gpu_hour_usd, cost_gpus, cost_per_mtok_usd, cost_per_1k_good_usd,
       output_tokens_per_s, goodput_rps, meets_sla
FROM accepted_trials
WHERE energy_j IS NOT NULL;
