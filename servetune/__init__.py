"""servetune: controlled, complete and comparable benchmarks and tuning for LLM serving engines."""

__version__ = "0.1.0"
