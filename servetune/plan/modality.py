"""Does the plan's model see images? Checked when the plan loads, before any GPU is touched.

An image workload against a model without a vision encoder would fail on every request (or be served as
text with the images dropped); a vision model measured on text only is legal but measures half the model,
so that one is a warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servetune.workload.spec import WorkloadSpec

# keys of an HF config.json that mean a vision tower (Qwen2/2.5/3-VL, LLaVA and friends, Gemma 3, Idefics, Pixtral)
_VISION_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual", "vision_encoder")


def vision_tower(engine: Any) -> bool | None:
    """Whether the engine's model has a vision encoder: the simulator profile's ``vision`` section, or a local
    model folder's config.json; None when it cannot be told here (a hub id, a folder on another host)."""
    if getattr(engine, "kind", None) == "sim":
        from servetune.sim.profiles import load_model_profile

        try:
            return load_model_profile(engine.model_profile).vision is not None
        except Exception:  # an unknown profile is the engine check's business, with its own message
            return None
    model = getattr(engine, "model", None)
    config = Path(str(model)) / "config.json" if model else None
    if config is None or not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return isinstance(data, dict) and any(k in data for k in _VISION_KEYS)


def check_modality(engine: Any, workload: WorkloadSpec) -> None:
    """Refuse images for a model without a vision encoder; warn when a vision model gets text only."""
    has = vision_tower(engine)
    images = workload.images is not None and workload.images.ratio > 0
    if images and has is False:
        raise ValueError("workload.images: the model has no vision encoder (no vision section in its config),"
                         " so it cannot take images: use a vision-language model or drop workload.images")
    if has and not images:
        warnings.warn("the model has a vision encoder but workload.images is empty: the trials measure text"
                      " only (add workload.images to measure the image path)", UserWarning, stacklevel=2)
