"""The report read back from the warehouse (real Postgres, loaded with the warehouse's own loader)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from typer.testing import CliRunner

from report_fixtures import write_campaign
from servetune.cli import app
from servetune.ingest import load_result
from servetune.report.html import key_cards, write_report
from servetune.report.sources import load_campaign
from servetune.warehouse import migrate

runner = CliRunner()


def test_report_from_experiment_id_matches_the_files(fresh_database_url: str, tmp_path: Path) -> None:
    migrate.upgrade(fresh_database_url)
    directory = write_campaign(tmp_path / "results")
    experiment = orjson.loads((directory / "experiment.json").read_bytes())  # what the answer cost, as the tuner
    experiment["gpu_seconds"] = 1830.0  # writes it: experiment.json's GPU time, state.json's starts
    (directory / "experiment.json").write_bytes(orjson.dumps(experiment))
    outcomes = [{"trial_id": f"t{i}", "restarted": i in (0, 5, 9), "startup_seconds": 60.0 if i in (0, 5, 9) else 0.0}
                for i in range(15)]
    (directory / "state.json").write_bytes(orjson.dumps({"outcomes": outcomes}))
    loaded = load_result(fresh_database_url, directory, validate=False)
    assert loaded.ok, loaded.errors
    exp_id = loaded.experiment_id

    from_files = load_campaign(str(directory))
    from_db = load_campaign(exp_id, database_url=fresh_database_url)
    assert from_db.source == f"warehouse:{exp_id}"
    assert [t.trial_id for t in from_db.trials] == [t.trial_id for t in from_files.trials]
    assert key_cards(from_db) == key_cards(from_files)
    assert {"key": "gpu-minutes", "label": "GPU min", "value": "30.5"} in key_cards(from_db)
    assert from_db.experiment["server_starts"] == from_files.experiment["server_starts"] == 3
    for a, b in zip(from_db.trials, from_files.trials, strict=True):
        assert a.summary == b.summary, a.trial_id  # the flattened columns rebuild the same summary
        assert len(a.gpu["samples"]) == len(b.gpu["samples"]) == 55  # the fixture's curve: 0 .. 64.8 s
        assert a.validation["success"] == b.validation["success"]

    out = tmp_path / "db-report"
    result = runner.invoke(app, ["report", exp_id, "--database-url", fresh_database_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 6
    assert 'id="fig-energy"' in html  # drawn from the stored energy columns and power samples
    assert ('<p id="rec-cost">The answer bought with 30.5 GPU min over 15 trials, 3 server starts'
            " (3.0 GPU min of start-ups).</p>") in html
    rejected = next(t for t in from_db.trials if t.status == "rejected")
    row = html[html.index(f'id="check-{rejected.trial_id}"'):]
    row = row[: row.index("</tr>")]
    assert '<small class="muted">gpu_memory_curve: expect_gpu_samples_cover_window(t_s)</small>' in row


def test_unknown_experiment_id(fresh_database_url: str) -> None:
    migrate.upgrade(fresh_database_url)
    result = runner.invoke(app, ["report", "no-such-experiment", "--database-url", fresh_database_url])
    assert result.exit_code == 2
    assert "no-such-experiment" in result.output and "no such experiment in the warehouse" in result.output


def test_validity_and_repeats_survive_the_warehouse(fresh_database_url: str, tmp_path: Path) -> None:
    """The INVALID trial, its reasons and the repeats read back from the summary columns; with no stated
    ceiling section in the warehouse, the marginal level is derived from the repeats."""
    migrate.upgrade(fresh_database_url)
    directory = write_campaign(tmp_path / "results", noisy=True)
    loaded = load_result(fresh_database_url, directory, validate=False)
    assert loaded.ok, loaded.errors
    campaign = load_campaign(loaded.experiment_id, database_url=fresh_database_url)
    bad = [t for t in campaign.trials if t.summary.valid is False]
    assert len(bad) == 1 and bad[0].summary.invalid_reasons[0] == "steady window 8.4 s < 20 s"
    html = (write_report(campaign, tmp_path / "r").html_path).read_text()
    row = html[html.index(f'id="check-{bad[0].trial_id}"'):]
    assert "INVALID: steady window 8.4 s &lt; 20 s" in row[: row.index("</tr>")]
    marginal = html[html.index('id="marginal"'):]
    assert "derived from the repeats" in marginal and "c=96" in marginal[: marginal.index("</p>")]
    assert "(95% CI, n=3," in html
