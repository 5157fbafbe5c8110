"""The environment fingerprint: everything that must match before two results are compared.

GPU model and driver, engine version and resolved arguments, model config, prompt template,
host and servetune's own version and commit. Secrets are dropped from the server arguments.
"""

from __future__ import annotations

import hashlib
import platform
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

import servetune
from servetune.telemetry.redact import redact

# /server_info keys that describe the moment, not the configuration
_VOLATILE_SERVER_KEYS = {"internal_states", "source", "engine", "version", "status", "reason", "models"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_hash(obj: Any) -> str:
    return _sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str))


@lru_cache(maxsize=1)
def git_revision() -> tuple[str | None, bool | None]:
    """(commit SHA, uncommitted changes?) of servetune's checkout; (None, None) when installed."""
    where = Path(servetune.__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return (sha or None), bool(status.strip())


def _gpu_part(gpu: dict[str, Any] | None) -> dict[str, Any]:
    devices = (gpu or {}).get("devices") or []
    first = devices[0] if devices else {}
    return {
        "gpu_state": (gpu or {}).get("state"),
        "gpu_model": first.get("name"),
        "gpu_count": len(devices),
        "gpu_uuids": [d.get("uuid") for d in devices],
        "gpu_mem_total": first.get("mem_total"),
        "driver": first.get("driver"),
        "cuda": first.get("cuda"),
    }


def _model_part(model_path: str | None) -> dict[str, Any]:
    """Config hash for a local model dir (hub ids are recorded as given, not hashed)."""
    out: dict[str, Any] = {
        "model_path": model_path,
        "model_config_hash": None,
        "chat_template_in_model": None,
    }
    if not model_path:
        return out
    root = Path(model_path).expanduser()
    config = root / "config.json"
    if config.is_file():
        out["model_config_hash"] = _sha256(config.read_bytes())
    template_file = root / "chat_template.jinja"
    tok_config = root / "tokenizer_config.json"
    if template_file.is_file():
        out["chat_template_in_model"] = template_file.read_text()
    elif tok_config.is_file():
        try:
            template = orjson.loads(tok_config.read_bytes()).get("chat_template")
        except (orjson.JSONDecodeError, AttributeError):
            template = None
        out["chat_template_in_model"] = template if isinstance(template, str) else None
    return out


def _template_text(prompt_template: str | None) -> tuple[str | None, str | None]:
    """(template text, source): a path to a template file is read; anything else is the text."""
    if prompt_template is None:
        return None, None
    if "\n" not in prompt_template and len(prompt_template) < 4096:
        p = Path(prompt_template).expanduser()
        if p.is_file():
            return p.read_text(), str(p)
    return prompt_template, "inline"


def fingerprint(
    *,
    gpu: dict[str, Any] | None = None,
    server_info: dict[str, Any] | None = None,
    model_path: str | None = None,
    prompt_template: str | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """The ``environment`` part of a trial result; ``environment_hash`` covers what must match.

    ``gpu`` is a ``GpuSampler`` result, ``server_info`` a ``fetch_server_info`` result.
    Without an explicit ``prompt_template`` the model directory's chat template is hashed.
    """
    info = redact(server_info or {})
    server_args = {k: v for k, v in info.items() if k not in _VOLATILE_SERVER_KEYS}
    model = _model_part(model_path)
    template, template_source = _template_text(prompt_template)
    model_template = model.pop("chat_template_in_model")
    if template is None and model_template is not None:
        template, template_source = model_template, "model"
    sha, dirty = git_revision()
    env: dict[str, Any] = {
        **_gpu_part(gpu),
        "engine": engine or info.get("engine"),
        "engine_version": info.get("version"),
        "server_args": server_args,
        "server_args_hash": _json_hash(server_args) if server_args else None,
        **model,
        "prompt_template_hash": _sha256(template.encode()) if template is not None else None,
        "prompt_template_source": template_source,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "servetune_version": servetune.__version__,
        "git_sha": sha,
        "git_dirty": dirty,
    }
    comparable = {
        k: env[k]
        for k in (
            "gpu_model",
            "gpu_count",
            "driver",
            "cuda",
            "engine",
            "engine_version",
            "server_args_hash",
            "model_path",
            "model_config_hash",
            "prompt_template_hash",
            "servetune_version",
        )
    }
    env["environment_hash"] = _json_hash(comparable)[:16]
    return env
