"""The campaign folder's one owner (servetune.experiment.ResultFolder): each file round-trips, writes are
atomic, and the kept campaigns under tests/data read back through it (their JSON rewritten byte for byte)."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from servetune.experiment import CAMPAIGN_FILES, ResultFolder
from servetune.result import TrialResult
from servetune.tuning.state import CampaignState

DATA = Path(__file__).resolve().parent / "data"
KEPT = {"transformers": DATA / "gpu-h200" / "campaign", "sglang": DATA / "gpu-h200-sglang" / "tune-a"}


def test_layout() -> None:
    f = ResultFolder("/runs/x")
    assert f.experiment_file == Path("/runs/x/experiment.json")
    assert f.state_file == Path("/runs/x/state.json")
    assert f.recommendation_file == Path("/runs/x/recommendation.json")
    assert f.trial_file("abc") == Path("/runs/x/trials/abc.json")
    assert f.report_file == Path("/runs/x/report/report.html")
    assert set(CAMPAIGN_FILES) == {"experiment.json", "state.json", "recommendation.json"}


def test_an_empty_folder_has_nothing(tmp_path: Path) -> None:
    f = ResultFolder(tmp_path / "new")
    assert not f.is_campaign() and not f.has_experiment()
    assert f.read_state_json() is None and f.read_recommendation() is None and f.trial_files() == []
    with pytest.raises(FileNotFoundError):
        f.read_experiment()
    f.create()
    assert f.is_campaign() and f.trials_dir.is_dir() and f.trial_files() == []


def test_each_file_round_trips(tmp_path: Path) -> None:
    f = ResultFolder(tmp_path)
    f.create()
    record = {"experiment_id": "e1", "model": "m", "status": "running", "gpu_seconds": 1.5, "ceiling": None}
    f.write_experiment(record)
    assert f.read_experiment() == record
    assert list(f.read_experiment()) == list(record)  # key order kept
    assert f.experiment_file.read_bytes() == orjson.dumps(record, option=orjson.OPT_INDENT_2)
    state = {"outcomes": []}
    f.write_state(state)
    assert orjson.loads(f.read_state_json()) == state
    rec = {"config": {"max-running-requests": 64}, "concurrency": 64}
    f.write_recommendation(rec)
    assert f.read_recommendation() == rec
    trial = TrialResult.read(next(iter(ResultFolder(KEPT["transformers"]).trial_files())))
    path = f.write_trial(trial)
    assert path == f.trial_file(trial.trial_id) and f.trial_files() == [path]
    assert f.read_trial(trial.trial_id).to_dict() == trial.to_dict()
    assert [t.trial_id for t in f.read_trials()] == [trial.trial_id]
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == []


def test_writes_are_atomic(tmp_path: Path) -> None:
    """A reader racing a writer of a big file only ever sees a whole file, the old one or the new one."""
    f = ResultFolder(tmp_path)
    big = [{"experiment_id": f"e{i}", "pad": [i] * 200_000} for i in range(2)]
    f.write_experiment(big[0])
    stop = threading.Event()
    seen: list[str] = []

    def write() -> None:
        for n in range(30):
            f.write_experiment(big[n % 2])
        stop.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not stop.is_set():
        seen.append(f.read_experiment()["experiment_id"])  # a partial file would not parse
    writer.join()
    assert seen and set(seen) <= {"e0", "e1"}
    assert [p.name for p in tmp_path.iterdir()] == ["experiment.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    f = ResultFolder(tmp_path)
    f.write_recommendation({"concurrency": 8})
    with pytest.raises(TypeError):
        f.write_recommendation({"concurrency": object()})
    assert f.read_recommendation() == {"concurrency": 8}


def test_under_finds_campaign_folders(tmp_path: Path) -> None:
    for name in ("b", "a"):
        ResultFolder(tmp_path / name).create()
        ResultFolder(tmp_path / name).write_experiment({"experiment_id": name})
    (tmp_path / "not-one").mkdir()
    assert [f.path.name for f in ResultFolder.under(tmp_path)] == ["a", "b"]


@pytest.mark.parametrize("kind", sorted(KEPT))
def test_the_kept_campaigns_read_back(kind: str, tmp_path: Path) -> None:
    kept = ResultFolder(KEPT[kind])
    exp = kept.read_experiment()
    state = CampaignState.model_validate_json(kept.read_state_json())
    trials = kept.read_trials()
    assert exp["experiment_id"] and state.outcomes and trials
    assert {t.experiment_id for t in trials} == {exp["experiment_id"]}
    assert {t.trial_id for t in trials} <= {o.trial_id for o in state.outcomes}
    assert kept.read_recommendation() == (exp["recommendation"] if kept.has_recommendation() else None)
    # what is read is what is written: the files come back byte for byte
    copy = ResultFolder(tmp_path)
    copy.write_experiment(exp)
    copy.write_state(orjson.loads(kept.read_state_json()))
    assert copy.experiment_file.read_bytes() == kept.experiment_file.read_bytes()
    assert copy.state_file.read_bytes() == kept.state_file.read_bytes()
    if kept.has_recommendation():
        copy.write_recommendation(kept.read_recommendation())
        assert copy.recommendation_file.read_bytes() == kept.recommendation_file.read_bytes()
