"""An image workload needs a model with a vision encoder: refused at load time, before any GPU; a vision model
measured on text only loads with a warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from servetune.plan import PlanError, parse_plan
from servetune.plan.modality import vision_tower

IMAGES = {"count": 1, "width": 448, "height": 448, "ratio": 0.5}


def _plan(engine: dict, images: dict | None = None, model: str = "m") -> dict:
    workload = {"name": "w", "seed": 1, "input": {"kind": "fixed", "value": 128},
                "output": {"kind": "fixed", "value": 8}}
    if images:
        workload["images"] = images
    return {"name": "p", "model": model, "engine": engine, "runner": {"kind": "local"}, "endpoint": "chat",
            "workload": workload, "sla": {"p99_ttft_ms": 2000},
            "stages": {"baseline": {"concurrency": 2, "requests": 10}, "ramp": {"levels": [4], "requests": 10},
                       "refine": {"enabled": False}}}


def _folder(tmp_path: Path, config: dict) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_images_for_a_text_only_model_are_refused_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no vision encoder") as exc:
        parse_plan(_plan({"kind": "sim", "model_profile": "llama-3.1-8b"}, IMAGES))
    assert "workload.images" in str(exc.value)
    text_model = _folder(tmp_path / "llama", {"architectures": ["LlamaForCausalLM"], "hidden_size": 64})
    with pytest.raises(PlanError, match="no vision encoder"):
        parse_plan(_plan({"kind": "sglang", "model": text_model}, IMAGES, model=text_model))


def test_a_vision_model_takes_images_and_warns_on_text_only(tmp_path: Path) -> None:
    vl = _folder(tmp_path / "qwen-vl", {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                                        "vision_config": {"depth": 32}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when images are measured
        parse_plan(_plan({"kind": "sim", "model_profile": "llava-8b"}, IMAGES))
        parse_plan(_plan({"kind": "sglang", "model": vl}, IMAGES, model=vl))
    with pytest.warns(UserWarning, match="measure text only"):
        parse_plan(_plan({"kind": "sglang", "model": vl}, model=vl))
    with pytest.warns(UserWarning, match="vision encoder"):
        parse_plan(_plan({"kind": "sim", "model_profile": "llava-8b"}))


def test_a_model_that_cannot_be_looked_at_here_is_not_judged(tmp_path: Path) -> None:
    class Hub:
        kind, model = "sglang", "Qwen/Qwen2.5-VL-7B-Instruct"  # a hub id: no folder on this host

    assert vision_tower(Hub()) is None
    plan = parse_plan(_plan({"kind": "sglang"}, IMAGES, model="Qwen/Qwen2.5-VL-7B-Instruct"))
    assert plan.workload.images is not None
