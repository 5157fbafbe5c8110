"""``RunnerConfig`` (where an engine runs: local / ssh / kubernetes) and ``RunningServer`` (what a trial gets)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

if TYPE_CHECKING:
    from servetune.runners.lifecycle import Server
    from servetune.runners.preflight import PreflightReport


class RunnerBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_s: float = Field(default=20.0, ge=0, description="SIGTERM -> SIGKILL grace period at teardown")
    poll_interval_s: float = Field(default=0.5, gt=0, description="readiness poll interval")
    check_clean: bool = Field(default=True, description="refuse to start on a dirty environment (preflight)")
    gpu_idle_mib: int = Field(default=2048, ge=0, description="GPU memory in use that still counts as idle")
    gpu_release_timeout_s: float = Field(default=60.0, ge=0, description="wait for GPU memory after teardown")
    gpu_type: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]*$",
                                 description="e.g. a100, h200: orchestrators route trials to a worker of this type")


class LocalRunnerConfig(RunnerBase):
    """A subprocess on this machine, in its own process group."""

    kind: Literal["local"] = "local"
    host: str = Field(default="127.0.0.1", description="address the engine binds")
    gpus: list[int] | None = Field(default=None, description="CUDA_VISIBLE_DEVICES; None: inherit, check all GPUs")
    cwd: Path | None = None


class SSHRunnerConfig(RunnerBase):
    """The engine on another host, reached over SSH with a local port forward."""

    kind: Literal["ssh"] = "ssh"
    host: str
    user: str | None = None
    ssh_port: int = Field(default=22, gt=0, lt=65536)
    identity_file: Path | None = None
    known_hosts_file: Path | None = Field(default=None, description="None: the user's known_hosts")
    strict_host_key_checking: Literal["yes", "accept-new"] = "yes"
    remote_port: int | None = Field(default=None, description="engine port on the remote host; None: a free one")
    gpus: list[int] | None = None
    workdir: str | None = Field(default=None, description="remote working directory")
    remote_python: str = Field(default="python3", description="for the remote preflight (stdlib only)")
    ssh_options: list[str] = Field(default_factory=list, description="extra ssh -o options, e.g. ProxyJump=bastion")
    connect_timeout_s: int = Field(default=10, gt=0)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host


class KubernetesRunnerConfig(RunnerBase):
    """A Pod (and a Service) manifest; applying it is left to kubectl (docs/engines.md)."""

    kind: Literal["kubernetes"] = "kubernetes"
    image: str = Field(default="lmsysorg/sglang:v0.5.23", description="engine image")
    namespace: str = "default"
    name: str = Field(default="servetune-engine", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    gpus: int = Field(default=1, ge=0)
    gpu_resource: str = "nvidia.com/gpu"
    container_port: int = Field(default=30000, gt=0, lt=65536)
    shm_size: str = "16Gi"
    model_pvc: str | None = Field(default=None, description="PersistentVolumeClaim holding the model")
    model_mount: str = "/models"
    node_selector: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    service: bool = True


RunnerConfig = Annotated[LocalRunnerConfig | SSHRunnerConfig | KubernetesRunnerConfig, Field(discriminator="kind")]
RUNNER_KINDS = ("local", "ssh", "kubernetes")
_adapter: TypeAdapter[Any] = TypeAdapter(RunnerConfig)


#: an engine on several GPUs of one host keeps NVLink multicast (NVLS) off: the lent multi-GPU hosts, and
#: any host whose fabric manager does not grant multicast, hang or fail in NCCL's NVLS init otherwise
MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_env(gpus: list[int] | int | None, extra: dict[str, str]) -> dict[str, str]:
    """What an engine process gets beyond the runner's environment: ``extra`` (the plan's own env wins),
    CUDA_VISIBLE_DEVICES for a list of GPUs, and MULTI_GPU_ENV when it runs on more than one."""
    env = dict(extra)
    if isinstance(gpus, list):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if (len(gpus) if isinstance(gpus, list) else gpus or 0) > 1:
        for k, v in MULTI_GPU_ENV.items():
            env.setdefault(k, v)
    return env


def parse_runner_config(data: dict[str, Any]) -> RunnerBase:
    return _adapter.validate_python(data)


def tail_file(path: Path | None, n: int = 50) -> list[str]:
    """The last ``n`` lines of a (possibly large, possibly still growing) log file."""
    if path is None or not path.is_file():
        return []
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return [line.rstrip("\n") for line in deque(fh, maxlen=n)]


@dataclass
class RunningServer:
    """A ready engine: where to send requests, how it was started, what it says it resolved."""

    url: str
    host: str
    port: int
    engine_kind: str
    argv: list[str]
    log_path: Path | None
    pid: int | None = None  # local process-group leader; for ssh the remote PGID
    model: str | None = None  # the model name requests carry
    resolved_args: dict[str, Any] = field(default_factory=dict)
    handle: Server | None = field(default=None, repr=False)

    def tail_log(self, n: int = 50) -> list[str]:
        return tail_file(self.log_path, n)

    def check_alive(self) -> None:
        """Raise ``EngineFailure`` (kind ``died``, with the log tail) if the engine has gone away."""
        if self.handle is not None:
            self.handle.check_alive()

    def preflight(self) -> PreflightReport:
        """The clean-environment check before a trial on this (already running) server."""
        if self.handle is None:
            raise RuntimeError("no handle: this RunningServer was not provisioned here")
        return self.handle.preflight_running()


@dataclass
class TeardownReport:
    """What stopping the engine took, and whether it left the environment clean."""

    clean: bool
    problems: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    port_free: bool | None = None
    gpu: str = "not checked"
    seconds: float = 0.0
