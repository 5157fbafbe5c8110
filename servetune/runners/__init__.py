"""Where an engine runs (local subprocess, SSH host, Kubernetes pod) and its lifecycle: start, ready, teardown."""

from servetune.runners.base import (
    RUNNER_KINDS,
    KubernetesRunnerConfig,
    LocalRunnerConfig,
    RunnerConfig,
    RunningServer,
    SSHRunnerConfig,
    TeardownReport,
    parse_runner_config,
)
from servetune.runners.lifecycle import Server, provision
from servetune.runners.preflight import PreflightReport, check_clean

__all__ = [
    "RUNNER_KINDS", "KubernetesRunnerConfig", "LocalRunnerConfig", "PreflightReport", "RunnerConfig",
    "RunningServer", "SSHRunnerConfig", "Server", "TeardownReport", "check_clean", "parse_runner_config",
    "provision",
]
