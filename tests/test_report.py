"""The HTML report from files: a campaign directory and a lone bench result, rendered in headless Chromium."""

from __future__ import annotations

import html as htmllib
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from PIL import Image
from typer.testing import CliRunner

from report_fixtures import make_trial, write_campaign
from servetune.cli import app
from servetune.report.campaign import (
    CampaignView as Campaign,
    ReportInputError,
    derive_ceiling,
    flag_value,
    meets_sla,
)
from servetune.report.evidence import curve_levels, series, validity_cells
from servetune.report.figures import all_figures, latency_figure, throughput_figure
from servetune.report.heatmap import cell_value
from servetune.report.html import diff_rows, write_report
from servetune.report.sources import load_campaign
from servetune.stats import spread

REPO = Path(__file__).resolve().parents[1]
FIGURE_KEYS = ("throughput", "latency", "gpu_memory", "energy", "prefix_hit_rate", "refine_heatmap")
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


#: run in Chromium: every table, figure and list of the page against the right edge of <main>
PROBE = """<script>
const main = document.querySelector('main').getBoundingClientRect();
const over = [...document.querySelectorAll('main table, main figure, main ul, main p')]
  .filter(e => e.getBoundingClientRect().right > main.right + 0.5)
  .map(e => (e.closest('section') || e).id + ' ' + e.tagName + ':' + Math.round(e.getBoundingClientRect().right));
document.body.setAttribute('data-probe', JSON.stringify({scroll: document.documentElement.scrollWidth, over}));
</script>"""


def page_overflow(html: str, tmp: Path, width: int = 1400) -> dict:
    """What of a report runs past the page in Chromium at ``width`` px: the page's scroll width and each
    table, figure, list or paragraph wider than <main> (by its section)."""
    probe = tmp / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([*_chromium_argv(tmp), f"--window-size={width},3000", "--dump-dom", probe.as_uri()],
                         check=True, timeout=120, capture_output=True, text=True).stdout
    return orjson.loads(htmllib.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))


def test_a_real_open_loop_campaign_fits_1400_px(tmp_path: Path) -> None:
    """Real SGLang trials (an H200 rate campaign) carry the widest cells: scheduler hit rates, dispatch
    fractions, long flags. The report still fits a 1,400-px window."""
    import tarfile

    with tarfile.open(REPO / "tests" / "data" / "gpu-h200-sglang" / "rate-a.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    html = write_report(load_campaign(str(tmp_path / "rate-a")), tmp_path / "report").html_path.read_text()
    found = page_overflow(html, tmp_path)
    assert found["over"] == [] and found["scroll"] <= 1400, found


def _colour_pixels(img: Image.Image, rgb: tuple[int, int, int], tol: int = 12) -> int:
    """How many pixels are within ``tol`` of a colour (only the figures draw these colours)."""
    r0, g0, b0 = rgb
    return sum(n for n, (r, g, b) in img.getcolors(maxcolors=1 << 20)
               if abs(r - r0) <= tol and abs(g - g0) <= tol and abs(b - b0) <= tol)


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    return write_campaign(tmp_path / "results", previous=PREVIOUS)


@pytest.fixture
def noisy_dir(tmp_path: Path) -> Path:
    """Repeats at c=64 and c=96 (marginal), one INVALID trial at c=96, a recommendation with CI and ties."""
    return write_campaign(tmp_path / "noisy", noisy=True)


def _row(html: str, row_id: str) -> str:
    row = html[html.index(f'id="{row_id}"'):]
    return row[: row.index("</tr>")]


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
    # plain words first, the checklist item as detail
    assert "rejected" in row
    assert '<small class="muted">gpu_memory_curve: expect_gpu_samples_cover_window(t_s)</small>' in row
    assert row.index("the GPU memory curve is missing or has holes") < row.index("gpu_memory_curve: expect_")
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
    assert {p.stem for p in out.glob("*.png")} == {"throughput", "latency", "gpu_memory", "energy", "prefix_hit_rate"}
    assert "Not drawn: no refinement trials in this campaign" in html
    assert "No recommendation in this result (a single bench trial)" in html
    assert 'id="rec-cost"' not in html and 'id="card-gpu-minutes"' not in html  # a bench trial states no GPU time


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
    plan = Path(__file__).resolve().parents[1] / "plans" / "demo.yaml"  # about 30 trials
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
    # what the answer cost: experiment.json's GPU time, state.json's trials and server starts
    outcomes = orjson.loads((run / "state.json").read_bytes())["outcomes"]
    starts = sum(o["restarted"] for o in outcomes)
    assert 0 < starts < len(outcomes) and experiment["gpu_seconds"] > 0
    said = (f'<p id="rec-cost">The answer bought with {experiment["gpu_seconds"] / 60:,.1f} GPU min (simulated)'
            f" over {len(outcomes)} trials, {starts} server starts")
    assert said in html, html[html.find('id="rec-cost"') - 20:][:300]
    assert html.count("bought with ") == 1  # the tuner's own line of it is not said twice
    card = html[html.index('id="card-gpu-minutes"'):][:200]
    assert f'<div class="value">{experiment["gpu_seconds"] / 60:,.1f}</div>' in card


def test_trial_tables_mark_valid_and_invalid_with_reasons(noisy_dir: Path, campaign_dir: Path,
                                                          tmp_path: Path) -> None:
    campaign = load_campaign(str(noisy_dir))
    html = write_report(campaign, tmp_path / "r").html_path.read_text()
    bad = next(t for t in campaign.trials if t.summary.valid is False)
    check = _row(html, f"check-{bad.trial_id}")
    assert '<td class="bad">INVALID</td>' in check and "not judged (INVALID)" in check
    assert "INVALID: steady window 8.4 s &lt; 20 s" in check
    assert "the client did not hold the load" in check
    row = _row(html, f"trial-{bad.trial_id}")
    assert '<td class="bad"' in row and ">INVALID</td>" in row
    assert "8.4 s" in row and '"num bad">120 / 384<' in row and "61.4 / 40.3 of 96" in row
    good = next(t for t in campaign.trials if t.stage == "ramp" and t.load["concurrency"] == 64)
    row = _row(html, f"trial-{good.trial_id}")
    assert '<td class="ok">VALID</td>' in row and "60.0 s" in row and "296 / 256" in row and "63.4 / 60.8 of 64" in row
    assert 'id="card-invalid"' in html and "INVALID trials (not used)</div><div class=\"value\">1<" in html

    legacy = load_campaign(str(campaign_dir))
    old = write_report(legacy, tmp_path / "old").html_path.read_text()
    row = _row(old, f"trial-{legacy.trials[3].trial_id}")
    assert '<td class="muted">-</td>' in row and "VALID" not in row
    assert 'id="card-invalid"' not in old


def test_validity_cells_open_loop_and_no_window() -> None:
    from datetime import UTC, datetime

    t = make_trial(experiment_id="x", stage=None, concurrency=16, created=datetime.now(UTC), valid=True)
    t.load = {"mode": "rate", "rate": 4.0}
    t.summary.scenario, t.summary.dispatch_fraction, t.summary.sustained = "open_loop", 0.97, False
    assert validity_cells(t)["in_flight"] == "dispatch 97%, not sustained"
    t.summary.valid, t.summary.window_source = False, "no_steady_window"
    cells = validity_cells(t)
    assert cells["validity"] == "INVALID" and cells["window"] == "no steady window"
    t.summary.valid = None
    assert validity_cells(t)["validity"] == "-" and validity_cells(t)["completions"] == "-"


def test_recommendation_shows_repeats_ci_ties_and_marginal(noisy_dir: Path, campaign_dir: Path,
                                                            tmp_path: Path) -> None:
    campaign = load_campaign(str(noisy_dir))
    html = write_report(campaign, tmp_path / "r").html_path.read_text()
    rec = orjson.loads((noisy_dir / "recommendation.json").read_bytes())
    assert rec["repeats"] == 3 and rec["goodput_ci95"] > 0 and rec["ties"]
    ci_text = (f"{rec['goodput_rps']:,.2f} ± {rec['goodput_ci95']:,.2f} req/s "
               f"(95% CI, n=3, CV {rec['goodput_cv']:.1%})")
    para = html[html.index('id="rec-goodput"'):]
    assert ci_text in para[: para.index("</p>")]
    assert f"{rec['goodput_rps']:,.2f} ± {rec['goodput_ci95']:,.2f}</div>" in html  # the goodput card
    assert '<div class="label">valid repeats</div><div class="value">3</div>' in html
    ties = html[html.index("<h3>Ties (within the noise)</h3>"):]
    ties = ties[: ties.index("</ul>")]
    assert htmllib.escape(rec["ties"][0], quote=False) in ties and "tie, kept the simpler config" in ties
    marginal = html[html.index('id="marginal"'):]
    assert "c=96" in marginal[: marginal.index("</p>")]

    old = write_report(load_campaign(str(campaign_dir)), tmp_path / "old").html_path.read_text()
    assert "(n=1: one trial, no interval)" in old and " ± " not in old
    assert 'id="ties-none"' in old and "<h3>Ties" not in old and 'id="marginal"' not in old


def test_invalid_trial_never_counts_for_the_ceiling(noisy_dir: Path) -> None:
    campaign = load_campaign(str(noisy_dir))
    bad = next(t for t in campaign.trials if t.summary.valid is False)
    assert bad.load["concurrency"] == 96 and not meets_sla(bad, campaign.sla)
    bad.summary.valid = None
    assert meets_sla(bad, campaign.sla)  # its numbers alone would pass the SLA
    assert derive_ceiling(campaign.main_curve(), campaign.sla) == 96  # and would lift c=96 (2 of 3 pass)
    bad.summary.valid = False
    assert derive_ceiling(campaign.main_curve(), campaign.sla) == 64  # INVALID: 1 of 2 VALID pass, a tie fails
    campaign.recommendation = None
    campaign.experiment.pop("recommendation")
    campaign.experiment.pop("ceiling")
    assert campaign.ceiling() == (64, "derived from the ramp (highest level meeting the p99 SLA)")
    html = write_report(campaign, noisy_dir / "derived").html_path.read_text()
    marginal = html[html.index('id="marginal"'):]
    assert "derived from the repeats" in marginal and "c=96" in marginal[: marginal.index("</p>")]


def test_curves_are_means_over_valid_repeats(noisy_dir: Path) -> None:
    campaign = load_campaign(str(noisy_dir))
    levels = {lv.concurrency: lv for lv in curve_levels(campaign)}
    assert len(levels[64].used) == 3 and not levels[64].invalid
    assert len(levels[96].used) == 2 and len(levels[96].invalid) == 1
    line = series(list(levels.values()), lambda s: s.goodput_rps)
    used = spread([t.summary.goodput_rps for t in levels[96].used])
    i = line.xs.index(96)
    assert line.means[i] == pytest.approx(used.mean) and line.ci95[i] == pytest.approx(used.ci95)
    assert line.invalid_xs == [96] and line.invalid_ys == [levels[96].invalid[0].summary.goodput_rps]
    assert line.invalid_ys[0] > line.means[i]  # the INVALID one would have pulled the mean up
    assert line.ci95[line.xs.index(32)] == 0.0  # one trial: no error bar
    for fig in (throughput_figure(campaign), latency_figure(campaign)):
        assert fig.png is not None
        assert "hollow grey circles: INVALID" in fig.caption and "excluded from the mean" in fig.caption
        assert "1 INVALID trial(s) not used" in fig.caption and "95% CI" in fig.caption


def test_heatmap_cells_pool_valid_repeats(noisy_dir: Path) -> None:
    campaign = load_campaign(str(noisy_dir))
    best = [t for t in campaign.refine_trials() if flag_value(t.server_config, "chunked_prefill_size") == 4096
            and flag_value(t.server_config, "schedule_conservativeness") == 0.7]
    value, note = cell_value(best, campaign.sla)
    assert len(best) == 3 and note == " (n=3)"
    assert value == pytest.approx(spread([t.summary.goodput_rps for t in best]).mean)
    best[0].summary.valid = False
    value, note = cell_value(best, campaign.sla)
    assert note == " (n=2)" and value == pytest.approx(spread([t.summary.goodput_rps for t in best[1:]]).mean)
    assert cell_value(best[:1], campaign.sla) == (0.0, "\nINVALID")


def test_the_answer_s_cost_says_what_it_knows(campaign_dir: Path, tmp_path: Path) -> None:
    """The GPU time line: trials and starts as stated, start-ups only where kept, the protocols apart; a
    campaign without an answer still says what it spent."""
    from servetune.report.cost import AnswerCost, answer_cost

    assert AnswerCost(gpu_seconds=600.0, trials=1).text() == "answer bought with 10.0 GPU min over 1 trial"
    assert AnswerCost(gpu_seconds=3690.0, trials=12, server_starts=4, startup_seconds=None,
                      protocols_gpu_seconds=90.0).text(answered=False) == (
        "no answer, for 61.5 GPU min over 12 trials, 4 server starts; the protocols before it took 1.5 GPU min more")
    campaign = load_campaign(str(campaign_dir))
    assert answer_cost(campaign) is None  # written before the figure was kept: no line, no card
    campaign.experiment.update(gpu_seconds=1230.0, server_starts=1, startup_gpu_seconds=95.0, status="failed")
    campaign.recommendation = None
    html = write_report(campaign, tmp_path / "r").html_path.read_text()
    assert (f'<p id="rec-cost">The campaign ended with no answer, for 20.5 GPU min over {len(campaign.trials)}'
            " trials, 1 server start (1.6 GPU min of start-ups).</p>") in html
