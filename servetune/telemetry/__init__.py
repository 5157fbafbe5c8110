"""servetune.telemetry: what else to watch during a trial (GPU, server metrics, server info, environment).

Modules: ``nvml`` (GpuSampler thread), ``prometheus`` (MetricsScraper, derive_signals),
``server_info`` (fetch_server_info), ``environment`` (fingerprint). See docs/telemetry.md.
"""
