"""Labels that never overstate (issue 20): a modelled figure says "simulated", a measured one does not;
flags read as a user types them; every table column of the report names its unit.

The simulated campaign is a real ``servetune tune --virtual`` run of plans/demo.yaml; the measured one is
the real H200 campaign kept in tests/data/gpu-h200/campaign.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.report.campaign import is_simulated
from servetune.report.html import diff_rows, flag_rows, write_report
from servetune.report.sources import load_campaign

REPO = Path(__file__).resolve().parents[1]
GPU_CAMPAIGN = REPO / "tests" / "data" / "gpu-h200" / "campaign"


def _text(path: Path) -> str:
    """The report's visible text (images dropped, tags stripped, whitespace collapsed)."""
    page = re.sub(r'data:image/png;base64,[^"]+', "", path.read_text())
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


@pytest.fixture(scope="module")
def virtual_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("virtual") / "campaign"
    res = CliRunner().invoke(app, ["tune", str(REPO / "plans" / "demo.yaml"), "--virtual", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_a_simulated_campaign_says_simulated_everywhere(virtual_campaign: Path, tmp_path: Path) -> None:
    campaign = load_campaign(str(virtual_campaign))
    assert campaign.trials and all(is_simulated(t) for t in campaign.trials)
    text = _text(write_report(campaign, tmp_path / "report").html_path)
    assert "Simulated: the figures of every trial are modelled by servetune.sim" in text
    assert "NVML samples" not in text  # the memory curve is the simulator's model, never NVML's
    assert "GPU memory during each trial (simulated)" in text
    assert "Simulated, not measured: servetune.sim's modelled GPU memory" in text
    assert "Throughput and goodput vs concurrency (simulated)" in text
    rows = [t for t in campaign.trials if t.summary.gpu_mem_peak_fraction is not None]
    assert rows and text.count("% (simulated)") >= len(rows)  # the GPU memory peak column of each trial


def test_a_partly_simulated_campaign_names_which_trials(virtual_campaign: Path, tmp_path: Path) -> None:
    """One trial rewritten as measured (its sim marks removed): the banner counts, the rows tell them apart."""
    copy = tmp_path / "mixed"
    shutil.copytree(virtual_campaign, copy)
    # trial files are named by random id: take one the memory figure draws (not the correctness trial)
    path, data = next((p, d) for p in sorted((copy / "trials").glob("*.json"))
                      if (d := orjson.loads(p.read_bytes()))["stage"] != "correctness" and d["gpu"].get("samples"))
    data["target"]["engine"] = "sglang"
    data["environment"].pop("simulated")
    data["gpu"]["state"] = "ok"
    data["summary"]["gpu_state"] = "ok"
    path.write_bytes(orjson.dumps(data))
    campaign = load_campaign(str(copy))
    n = len(campaign.trials)
    text = _text(write_report(campaign, tmp_path / "report").html_path)
    assert f"Simulated ({n - 1} of {n} trials simulated): the figures of the trials marked \"simulated\"" in text
    assert "NVML samples; trials marked (simulated) are servetune.sim's model" in text


def test_a_real_gpu_campaign_is_not_labelled_simulated(tmp_path: Path) -> None:
    campaign = load_campaign(str(GPU_CAMPAIGN))
    assert campaign.trials and not any(is_simulated(t) for t in campaign.trials)
    text = _text(write_report(campaign, tmp_path / "report").html_path)
    assert "imulated" not in text  # neither "Simulated" nor "simulated" anywhere
    assert "NVML samples: used memory (GiB" in text
    for header in ("streams", "goodput req/s", "errors %", "hit %", "GPU mem peak %", "window s",
                   "TTFT p50 / p99 ms", "E2E p99 ms", "errors as % of requests", "hit rate as % of prompt tokens"):
        assert header in text, header


def test_flags_read_as_typed(virtual_campaign: Path, tmp_path: Path) -> None:
    """A store-true switch is ``--disable-cuda-graph`` alone: never 'True', in the table, the command or the diff."""
    assert flag_rows({"disable-cuda-graph": True, "chunked-prefill-size": 4096, "enable-x": False}) == [
        {"flag": "chunked-prefill-size", "value": "4096"}, {"flag": "disable-cuda-graph", "value": "(switch)"}]
    rows = diff_rows({"config": {"disable-cuda-graph": {"old": None, "new": True}}})
    assert rows == [{"field": "disable-cuda-graph", "before": "-", "after": "set", "change": ""}]
    copy = tmp_path / "switch"
    shutil.copytree(virtual_campaign, copy)
    rec = orjson.loads((copy / "recommendation.json").read_bytes())
    rec["config"] = {"chunked-prefill-size": 4096, "disable-cuda-graph": True}
    (copy / "recommendation.json").write_bytes(orjson.dumps(rec))
    text = _text(write_report(load_campaign(str(copy)), tmp_path / "report").html_path)
    assert "As typed: --chunked-prefill-size 4096 --disable-cuda-graph" in text
    assert "True" not in text
