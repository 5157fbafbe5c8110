"""servetune.sim: a simulated SGLang server (a model of its scheduler, never a measurement).

``simulate(...)`` runs a workload in virtual time and returns a TrialResult shaped like a measured
one; ``servetune sim serve`` serves the same model over SGLang's HTTP surface in real time.
See docs/sim.md for the model, its assumptions and its limits.
"""

from .args import SimArgs, SimArgsError, build_parser, parse_argv, server_args_from_flags
from .profiles import GpuProfile, ModelProfile, ProfileError, load_gpu_profile, load_model_profile
from .virtual import simulate

__all__ = [
    "GpuProfile",
    "ModelProfile",
    "ProfileError",
    "SimArgs",
    "SimArgsError",
    "build_parser",
    "load_gpu_profile",
    "load_model_profile",
    "parse_argv",
    "server_args_from_flags",
    "simulate",
]
