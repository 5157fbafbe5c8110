"""servetune.telemetry"""
