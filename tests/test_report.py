"""The HTML report from files: a campaign directory and a lone bench result, rendered in headless Chromium."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from PIL import Image
from report_fixtures import make_trial, write_campaign
from typer.testing import CliRunner

from servetune.cli import app
from servetune.report.campaign import Campaign, ReportInputError, flag_value, load_campaign
from servetune.report.figures import all_figures
from servetune.report.html import diff_rows, write_report

FIGURE_KEYS = ("throughput", "latency", "gpu_memory", "prefix_hit_rate", "refine_heatmap")
PREVIOUS = {"config": {"chunked-prefill-size": 8192, "schedule-conservativeness": 1.0, "max-running-requests": 64,
                       "enable-cache-report": True},
            "concurrency": 64, "goodput_rps": 7.5, "prefix_hit_rate": 0.61, "p99_ttft_ms": 650.0}
runner = CliRunner()


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _chromium_argv(tmp: Path) -> list[str]:
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found (install it with scripts/system-deps.sh as root)")
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'chromium-profile'}", "--window-size=1280,2000"]


def _colour_pixels(img: Image.Image, rgb: tuple[int, int, int], tol: int = 12) -> int:
    """How many pixels are within ``tol`` of a colour (only the figures draw these colours)."""
    r0, g0, b0 = rgb
    return sum(n for n, (r, g, b) in img.getcolors(maxcolors=1 << 20)
               if abs(r - r0) <= tol and abs(g - g0) <= tol and abs(b - b0) <= tol)


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    return write_campaign(tmp_path / "results", previous=PREVIOUS)


def test_campaign_report_renders_in_chromium(campaign_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(campaign_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    html_path = out / "report.html"
    assert result.stdout.strip().endswith(str(html_path))
    html = html_path.read_text()

    # self-contained: every figure embedded, nothing fetched from elsewhere; PNGs written beside it too
    embedded = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(embedded) == len(FIGURE_KEYS)
    for key in FIGURE_KEYS:
        assert f'id="fig-{key}"' in html
        assert Image.open(out / f"{key}.png").size[0] > 500
    assert not re.search(r'(src|href)="(?!data:)', html)

    rec = orjson.loads((campaign_dir / "recommendation.json").read_bytes())
    assert f"{rec['goodput_rps']:,.2f}" in html
    assert f"{rec['p99_ttft_ms']:,.1f}" in html
    assert f"{rec['prefix_hit_rate']:.1%}" in html
    assert "chunked-prefill-size" in html and ">4096<" in html
    assert 'id="diff"' in html and "+14.6%" in html  # goodput 7.5 -> 8.60 from the tuning diff

    argv = _chromium_argv(tmp_path)
    shot = tmp_path / "shot.png"
    subprocess.run([*argv, f"--screenshot={shot}", html_path.as_uri()], check=True, timeout=120,
                   capture_output=True)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2000)
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 500, "screenshot looks blank"
    grey = img.convert("L")
    mean = sum(grey.getdata()) / (grey.width * grey.height)
    variance = sum((p - mean) ** 2 for p in grey.getdata()) / (grey.width * grey.height)
    assert variance > 200, f"screenshot nearly uniform (variance {variance:.0f})"
    # the first two figures are on screen: their line colours (throughput blue, ceiling red) were painted
    assert _colour_pixels(img, (0x2C, 0x7F, 0xB8)) > 300
    assert _colour_pixels(img, (0xC0, 0x39, 0x2B)) > 100

    dom = subprocess.run([*argv, "--dump-dom", html_path.as_uri()], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert len(re.findall(r"<img src=\"data:image/png;base64,", dom)) == len(FIGURE_KEYS)
    assert 'id="card-goodput"' in dom and f"{rec['goodput_rps']:,.2f}" in dom
    assert dom.count('<tr id="check-') == 15


def test_checklist_and_sla_columns(campaign_dir: Path, tmp_path: Path) -> None:
    campaign = load_campaign(str(campaign_dir))
    html = write_report(campaign, tmp_path / "r").html_path.read_text()
    rejected = next(t for t in campaign.trials if t.status == "rejected")
    row = html[html.index(f'id="check-{rejected.trial_id}"'):]
    row = row[: row.index("</tr>")]
    assert "rejected" in row and "expect_gpu_samples_cover_window (t_s)" in row
    assert "validation failed: gpu_memory_curve" in row
    c96 = next(t for t in campaign.trials if t.stage == "ramp" and t.load["concurrency"] == 96)
    row96 = html[html.index(f'id="check-{c96.trial_id}"'):]
    assert "missed" in row96[: row96.index("</tr>")]  # validated fine, but over the p99 TTFT bound


def test_lone_bench_result(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    trial = make_trial(experiment_id=None, stage=None, concurrency=32, created=datetime.now(UTC))
    trial.stage = None
    path = trial.save(tmp_path / "bench.json")
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "bench-report"
    html = (out / "report.html").read_text()
    assert "single bench trial" in html
    assert {p.stem for p in out.glob("*.png")} == {"throughput", "latency", "gpu_memory", "prefix_hit_rate"}
    assert "Not drawn: no refinement trials in this campaign" in html
    assert "No recommendation in this result (a single bench trial)" in html


def test_ceiling_derived_when_not_stated(campaign_dir: Path) -> None:
    campaign = load_campaign(str(campaign_dir))
    campaign.recommendation = None
    campaign.experiment.pop("recommendation")
    assert campaign.ceiling() == (64, "derived from the ramp (highest level meeting the p99 SLA)")


def test_missing_gpu_samples_are_said_not_drawn(campaign_dir: Path) -> None:
    campaign = load_campaign(str(campaign_dir))
    for t in campaign.trials:
        t.gpu = {"state": "no_gpu"}
        t.summary.gpu_state = "no_gpu"
    fig = next(f for f in all_figures(campaign) if f.key == "gpu_memory")
    assert fig.png is None and "no_gpu" in fig.note


def test_diff_rows_read_the_tuning_layout() -> None:
    assert diff_rows(None) is None
    rows = diff_rows({"config": {"chunked-prefill-size": {"old": 8192, "new": 4096}},
                      "figures": {"goodput_rps": {"old": 7.5, "new": 8.6, "change": 0.1467},
                                  "concurrency": {"old": 64, "new": 64}},
                      "same_config": False})
    assert rows == [{"field": "chunked-prefill-size", "before": "8192", "after": "4096", "change": ""},
                    {"field": "goodput_rps", "before": "7.50", "after": "8.60", "change": "+14.7%"}]
    assert diff_rows({"max_running_requests": [None, 64]})[0]["after"] == "64"


def test_flag_spellings() -> None:
    for spelling in ("chunked_prefill_size", "chunked-prefill-size", "--chunked-prefill-size"):
        assert flag_value({spelling: 4096}, "chunked_prefill_size") == 4096
    assert flag_value({}, "chunked_prefill_size") is None


def test_bad_inputs_name_the_file_and_cause(tmp_path: Path) -> None:
    not_json = tmp_path / "x.json"
    not_json.write_text("{nope")
    result = runner.invoke(app, ["report", str(not_json)])
    assert result.exit_code == 2 and "x.json" in result.output and "not valid JSON" in result.output

    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps({"schema": "something/9"}))
    with pytest.raises(ReportInputError, match="other.json: neither a trial result"):
        load_campaign(str(other))

    broken = write_campaign(tmp_path / "res")
    victim = next((broken / "trials").glob("*.json"))
    victim.write_bytes(orjson.dumps({"schema": "servetune.trial/1"}))
    with pytest.raises(ReportInputError, match=re.escape(victim.name) + ".*trial_id"):
        load_campaign(str(broken))

    assert runner.invoke(app, ["report", str(tmp_path / "missing" / "dir")]).exit_code == 2


def test_empty_campaign_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "trials").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no trials" in result.output


def test_figures_are_pngs(campaign_dir: Path) -> None:
    campaign: Campaign = load_campaign(str(campaign_dir))
    for fig in all_figures(campaign):
        assert fig.png is not None, fig.note
        assert Image.open(io.BytesIO(fig.png)).format == "PNG"


def test_report_of_a_real_virtual_campaign(tmp_path: Path) -> None:
    """The tuning CLI's own result folder (simulated engine, virtual time), as written, not a fixture."""
    plan = Path(__file__).resolve().parents[1] / "plans" / "8b-chat.yaml"
    run = tmp_path / "run"
    tuned = runner.invoke(app, ["tune", str(plan), "--virtual", "--out", str(run)])
    assert tuned.exit_code == 0, tuned.output
    campaign = load_campaign(str(run))
    ceiling, source = campaign.ceiling()
    experiment = orjson.loads((run / "experiment.json").read_bytes())
    assert (ceiling, source) == (experiment["ceiling"]["concurrency"], "experiment.ceiling")
    figures = {f.key: f for f in all_figures(campaign)}
    assert all(f.png is not None for f in figures.values()), {k: f.note for k, f in figures.items()}
    html = write_report(campaign, tmp_path / "r").html_path.read_text()
    rec = orjson.loads((run / "recommendation.json").read_bytes())
    assert f"{rec['goodput_rps']:,.2f}" in html
    assert html.count('<tr id="check-') == len(list((run / "trials").glob("*.json")))
