"""The scheduler figure and hit rate: drawn only when a trial carries SGLang's batch log (files or warehouse)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from PIL import Image

from report_fixtures import write_campaign
from servetune.ingest import load_result
from servetune.report.campaign import CampaignView as Campaign, level_of
from servetune.report.figures import all_figures, prefix_hit_figure
from servetune.report.html import key_cards, write_report
from servetune.report.scheduler import TITLE, scheduler_trial
from servetune.report.sources import load_campaign
from servetune.warehouse import migrate
from warehouse_fixtures import with_scheduler_log

BASE_KEYS = ["throughput", "latency", "gpu_memory", "energy", "prefix_hit_rate", "refine_heatmap"]


def _with_logs(directory: Path, pick) -> Campaign:
    """Attach a scheduler log to the trials ``pick`` chooses and rewrite their files, as the runner would have."""
    campaign = load_campaign(str(directory))
    for t in campaign.trials:
        if pick(t):
            with_scheduler_log(t, seconds=60, concurrency=level_of(t) or 1)
            t.save(directory / "trials" / f"{t.trial_id}.json")
    return load_campaign(str(directory))


@pytest.fixture
def plain_dir(tmp_path: Path) -> Path:
    return write_campaign(tmp_path / "plain")


def test_no_scheduler_log_no_figure(plain_dir: Path, tmp_path: Path) -> None:
    campaign = load_campaign(str(plain_dir))
    assert scheduler_trial(campaign) is None
    assert [f.key for f in all_figures(campaign)] == BASE_KEYS
    assert "Third bar" not in prefix_hit_figure(campaign).caption
    assert "sched-hit-rate" not in {c["key"] for c in key_cards(campaign)}
    out = write_report(campaign, tmp_path / "report")
    html = out.html_path.read_text()
    assert 'id="fig-scheduler"' not in html and 'id="card-sched-hit-rate"' not in html
    assert "scheduler" not in html.replace(campaign.source, "").lower()  # the tmp path names this test
    assert not (tmp_path / "report" / "scheduler.png").exists()


def test_figure_for_the_evidence_trial(plain_dir: Path, tmp_path: Path) -> None:
    evidence = set(load_campaign(str(plain_dir)).recommendation["evidence_trial_ids"])
    campaign = _with_logs(plain_dir, lambda t: t.trial_id in evidence or level_of(t) == 128)
    chosen, why = scheduler_trial(campaign)
    assert chosen.trial_id in evidence and "evidence" in why  # not the higher-concurrency trial

    figures = {f.key: f for f in all_figures(campaign)}
    assert list(figures) == [*BASE_KEYS, "scheduler"]
    fig = figures["scheduler"]
    assert fig.title == TITLE and fig.png is not None
    assert "scheduler's own log lines" in fig.caption and chosen.trial_id in fig.caption
    assert "60 prefill batches and 60 decode lines" in fig.caption and "1 other trial(s)" in fig.caption
    assert Image.open(io.BytesIO(fig.png)).size[0] > 800
    assert "Third bar" in figures["prefix_hit_rate"].caption

    html = write_report(campaign, tmp_path / "report").html_path.read_text()
    assert 'id="fig-scheduler"' in html and (tmp_path / "report" / "scheduler.png").is_file()
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == len(BASE_KEYS) + 1
    rate = f"{chosen.summary.sched_cache_hit_rate:.1%}"
    card = html[html.index('id="card-sched-hit-rate"'):]
    assert rate in card[: card.index("</div></div>")]
    assert f"(scheduler {rate})" in html  # beside the usage hit rate in the trial table


def test_highest_concurrency_when_the_evidence_has_no_log(plain_dir: Path) -> None:
    campaign = _with_logs(plain_dir, lambda t: t.stage == "ramp" and level_of(t) in (16, 96))
    chosen, why = scheduler_trial(campaign)
    assert level_of(chosen) == 96 and "highest concurrency" in why


def test_scheduler_rows_come_back_from_the_warehouse(fresh_database_url: str, plain_dir: Path) -> None:
    migrate.upgrade(fresh_database_url)
    from_files = _with_logs(plain_dir, lambda t: t.stage == "ramp")
    loaded = load_result(fresh_database_url, plain_dir, validate=False)
    assert loaded.ok, loaded.errors
    from_db = load_campaign(loaded.experiment_id, database_url=fresh_database_url)
    for a, b in zip(from_db.trials, from_files.trials, strict=True):
        assert a.summary == b.summary
        assert a.server.get("scheduler_log") == b.server.get("scheduler_log"), a.trial_id
    assert scheduler_trial(from_db)[0].trial_id == scheduler_trial(from_files)[0].trial_id
    assert [f.key for f in all_figures(from_db)] == [*BASE_KEYS, "scheduler"]
    assert key_cards(from_db) == key_cards(from_files)
