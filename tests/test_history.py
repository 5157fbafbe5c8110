"""``servetune history`` on a real warehouse: campaigns loaded with the warehouse's loader, newest first, trends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from rich.console import Console
from typer.testing import CliRunner

from report_fixtures import write_campaign
from servetune.cli import app
from servetune.ingest import load_result
from servetune.report.history import fetch_history, history_table, trend
from servetune.warehouse import migrate

runner = CliRunner()
MODEL = "llama-3.1-8b"


GPU_SECONDS = {1: 1830.0, 2: 2466.0}  # 30.5 and 41.1 GPU min


def _with_cost(d: Path, gpu_seconds: float, *, starts: int) -> None:
    exp = orjson.loads((d / "experiment.json").read_bytes())
    (d / "experiment.json").write_bytes(orjson.dumps({**exp, "gpu_seconds": gpu_seconds}))
    outcomes = [{"trial_id": f"t{i}", "restarted": i < starts, "startup_seconds": 60.0 if i < starts else 0.0}
                for i in range(15)]
    (d / "state.json").write_bytes(orjson.dumps({"outcomes": outcomes}))


def _seed(url: str, root: Path) -> list[str]:
    """Three weekly campaigns of one model (the last with a collapsed prefix cache) and one of another."""
    migrate.upgrade(url)
    start = datetime(2026, 10, 5, 3, 0, tzinfo=UTC)
    ids = []
    for week, (speed, hit) in enumerate(((1.0, 0.62), (1.1, 0.61), (0.8, 0.20))):
        d = write_campaign(root, model=MODEL, started=start + timedelta(weeks=week), speed=speed, hit_rate=hit)
        if week:  # what each answer cost (experiment.json, state.json); the first week's from before it was kept
            _with_cost(d, GPU_SECONDS[week], starts=3 + week)
        report = load_result(url, d, validate=False)
        assert report.ok, report.errors
        ids.append(report.experiment_id)
    other = write_campaign(root, model="qwen2-vl-7b", started=start, speed=2.0)
    assert load_result(url, other, validate=False).ok
    return ids


def test_history_newest_first_with_trends(fresh_database_url: str, tmp_path: Path) -> None:
    ids = _seed(fresh_database_url, tmp_path)
    entries = fetch_history(MODEL, database_url=fresh_database_url)
    assert [e.experiment_id for e in entries] == ids[::-1]  # newest first, the other model left out
    newest, middle, oldest = entries
    assert newest.prefix_hit_rate == 0.20 and oldest.prefix_hit_rate == 0.62
    assert all(e.trials_total == 15 and e.trials_ok == 14 for e in entries)
    assert all(e.ceiling == 64 for e in entries)  # from the ceiling_history view
    assert newest.goodput_rps < middle.goodput_rps

    console = Console(width=220, record=True, color_system="truecolor")
    console.print(history_table(MODEL, entries))
    text = console.export_text(clear=False)
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("│") and "weekly" in ln]
    assert [ln.split("│")[2].strip() for ln in lines] == [i[:12] for i in ids[::-1]]
    newest_line = lines[0]
    assert "20.0% ↓" in newest_line and "62.0%" in lines[2]
    assert "chunk=4096, cons=0.7" in newest_line
    styled = [ln for ln in console.export_text(styles=True).splitlines() if ids[-1][:12] in ln][0]
    assert "\x1b[1;31m↓" in styled  # the hit-rate drop is a bold red arrow
    # what each answer cost: its GPU minutes beside its trials ('-' where the campaign kept none)
    assert [(e.gpu_seconds, e.server_starts) for e in entries] == [(2466.0, 5), (1830.0, 4), (None, None)]
    header = next(ln for ln in text.splitlines() if "trials ok" in ln)
    assert [c.strip() for c in header.split("┃")][5:7] == ["trials ok", "GPU min"]
    assert [ln.split("│")[6].strip() for ln in lines] == ["41.1", "30.5", "-"]


def test_history_fits_100_columns_with_every_figure(fresh_database_url: str, tmp_path: Path) -> None:
    """A narrow terminal gets the compact table: no cell cut short, the config whole over its lines."""
    _seed(fresh_database_url, tmp_path)
    result = runner.invoke(app, ["history", "--model", MODEL, "--database-url", fresh_database_url],
                           env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert max(len(ln) for ln in out.splitlines()) <= 100 and "…" not in out
    assert "(weekly runs)" in out and "41.1" in out and "30.5" in out  # one trigger: said once, in the title
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("2026-")]
    assert len(rows) == 3 and "20.0% ↓" in rows[0] and "41.1" in rows[0] and "62.0%" in rows[2]
    assert all(word in out for word in ("chunk=4096,", "cons=0.7,", "max-running=64"))  # the config, unabridged


def test_trend_arrows_know_which_way_is_better() -> None:
    assert str(trend(0.20, 0.62, True)) == "↓" and trend(0.20, 0.62, True).style == "bold red"
    assert trend(500.0, 650.0, False).style == "bold green"  # p99 TTFT went down: better
    assert str(trend(0.61, 0.62, True)) == "→"  # within 2%: noise
    assert str(trend(None, 0.62, True)) == " "


def test_history_cli(fresh_database_url: str, tmp_path: Path) -> None:
    _seed(fresh_database_url, tmp_path)
    result = runner.invoke(app, ["history", "--model", MODEL, "--database-url", fresh_database_url],
                           env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "servetune history: llama-3.1-8b" in result.output
    assert result.output.count("weekly") == 3 and "qwen" not in result.output

    empty = runner.invoke(app, ["history", "--model", "nobody", "--database-url", fresh_database_url])
    assert empty.exit_code == 0 and "no experiments for model 'nobody'" in empty.output


def test_history_without_a_database(monkeypatch) -> None:
    monkeypatch.delenv("SERVETUNE_DATABASE_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_SERVETUNE_WAREHOUSE", raising=False)
    result = runner.invoke(app, ["history", "--model", MODEL])
    assert result.exit_code == 2 and "SERVETUNE_DATABASE_URL" in result.output
