"""Multi-turn sessions (servetune.loadgen.sessions): users as the load unit, each turn sent after the
previous answer has arrived, with that answer's text in its history, after the user's think time.

Against the simulated server in virtual time and live over HTTP (its radix cache holds every prompt and
answer, so a turn whose history carries the real answer is served from the cache past that answer: a
stand-in text of the same length would miss there), and against vLLM on the CPU (tests/test_real_engine.py
style: a real engine we did not write)."""

from __future__ import annotations

import orjson
import pytest

from servetune.loadgen import LoadConfig, Target
from servetune.loadgen.endpoints import request_body
from servetune.loadgen.sessions import load_units
from servetune.sim.virtual import simulate
from servetune.trial import TrialRequest, run_trial
from servetune.validity import ValidityRules
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, MultiTurn, SharedPrefix, Uniform, WorkloadSpec
from test_bench_cli import sim_url  # noqa: F401  (fixture: `servetune sim serve` in its own process)

TURNS = 4


def spec(think: float = 0.0, **kw) -> WorkloadSpec:
    return WorkloadSpec(name="sessions", seed=3, input=Uniform(min=200, max=400), output=Fixed(value=40),
                        shared_prefix=SharedPrefix(tokens=64),
                        multi_turn=MultiTurn(turns=TURNS, turn_input=Fixed(value=30), think_time_s=think, **kw))


def by_session(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.session, []).append(r)
    return {k: sorted(v, key=lambda r: r.turn) for k, v in out.items()}


def assert_turns_follow_answers(records, think: dict[tuple[int, int], float] | None = None,
                                slack_s: float = 1e-6) -> None:
    """(live: ``slack_s`` for the event loop's timers, which round to the millisecond)"""
    sessions = by_session(records)
    assert -1 not in sessions and all(len(rs) == TURNS for rs in sessions.values())
    for sid, rs in sessions.items():
        for a, b in zip(rs, rs[1:], strict=False):
            ended = a.t_send_s + a.e2e_ms / 1000
            pause = think.get((sid, b.turn), 0.0) if think else 0.0
            assert b.t_send_s >= ended + pause - slack_s, (sid, b.turn, b.t_send_s, ended, pause)
            # the next prompt is this one, its answer and a new user message
            assert b.prompt_tokens >= a.prompt_tokens + a.completion_tokens + 30


def test_sessions_are_the_load_units_and_scripted_turns_are_not() -> None:
    reqs = build_requests(spec(), 12).requests
    assert load_units(reqs) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    scripted = build_requests(spec(mode="scripted", interleave=3), 12).requests
    assert load_units(scripted) == [[i] for i in range(12)]
    with pytest.raises(ValueError, match="think_time_s applies to mode: sessions"):
        MultiTurn(mode="scripted", think_time_s=1.0)


def test_a_later_turn_carries_the_real_answers_in_its_body() -> None:
    turn2 = build_requests(spec(), 3).requests[2]
    target = Target(url="http://127.0.0.1:1", endpoint="chat")
    body = orjson.loads(request_body(target, turn2.with_answers(["first answer", "second answer"])))
    roles = [(m["role"], m["content"]) for m in body["messages"]]
    assert [r for r, _ in roles] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert roles[2][1] == "first answer" and roles[4][1] == "second answer"
    assert "first answer" not in request_body(target, turn2).decode()  # the stand-ins, before the answers exist


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_virtual_sessions_wait_for_answers_and_hit_the_cache_past_them(mode) -> None:
    batch = build_requests(spec(think=0.5), 160)
    think = {(r.conversation, r.turn): r.think_s for r in batch.requests}
    assert sum(t > 0 for t in think.values()) == 120  # every later turn thinks, seeded
    load = LoadConfig(mode=mode, concurrency=4, rate=1.0 if mode == "rate" else None, warmup_requests=8)
    res = simulate({"model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G", "enable_cache_report": True},
                   batch.requests, load, rules=ValidityRules(min_window_s=5, min_completions=40))
    assert_turns_follow_answers(res.records, think)
    for a, b in (pair for rs in by_session(res.records).values() for pair in zip(rs, rs[1:], strict=False)):
        assert b.cached_tokens >= a.prompt_tokens + a.completion_tokens - 1  # history and answer from the cache
    rows = res.summary.by_turn
    assert [row["turn"] for row in rows] == list(range(TURNS))
    hits = [row["cached_tokens_mean"] for row in rows]
    assert hits == sorted(hits) and hits[-1] > 5 * hits[0]
    assert rows[-1]["hit_rate"] > 0.85 > rows[0]["hit_rate"]
    # users are the unit: four in a closed loop, whatever their think time, and the trial is VALID
    assert res.summary.valid, res.summary.invalid_reasons
    if mode == "concurrency":
        assert res.summary.in_flight_mean > 3.6


def test_live_sessions_against_the_simulated_server(sim_url) -> None:  # noqa: F811
    req = TrialRequest(target=Target(url=sim_url, endpoint="chat", timeout_s=60),
                       load=LoadConfig(concurrency=3, warmup_requests=4), workload=spec(think=0.05),
                       num_requests=20, validity=ValidityRules(min_window_s=0.5, min_completions=5))
    t = run_trial(req)
    assert t.status == "ok" and t.summary.requests_ok == 20 and len(t.records) == 24
    think = {(r.conversation, r.turn): r.think_s for r in build_requests(spec(think=0.05), 24).requests}
    assert_turns_follow_answers(t.records, think, slack_s=0.002)
    for a, b in (pair for rs in by_session(t.records).values() for pair in zip(rs, rs[1:], strict=False)):
        assert b.cached_tokens >= a.prompt_tokens + a.completion_tokens - 1  # the real answer was in the history
    hits = [row["cached_tokens_mean"] for row in t.summary.by_turn]
    assert hits == sorted(hits) and hits[-1] > hits[0]


@pytest.mark.vllm
def test_sessions_against_vllm_on_the_cpu(vllm_server) -> None:
    """vLLM caches whole KV blocks (128 tokens on the CPU backend): later turns add 150 tokens each, so the
    cached share of a turn's prompt grows with the turn index."""
    workload = WorkloadSpec(name="sessions-vllm", seed=5, input=Uniform(min=180, max=240), output=Fixed(value=16),
                            multi_turn=MultiTurn(turns=3, turn_input=Fixed(value=134)))
    req = TrialRequest(target=Target(url=vllm_server.url, endpoint="completions", model=vllm_server.model,
                                     timeout_s=300),
                       load=LoadConfig(concurrency=3, warmup_requests=3), workload=workload, num_requests=15,
                       tokenizer=str(vllm_server.model_path),
                       validity=ValidityRules(min_window_s=0.5, min_completions=5))
    t = run_trial(req)
    assert t.status == "ok" and t.summary.requests_ok == 15 and len(t.records) == 18, t.summary.errors_by_class
    sessions = by_session(t.records)
    assert len(sessions) == 6
    for rs in sessions.values():
        for a, b in zip(rs, rs[1:], strict=False):
            assert b.t_send_s >= a.t_send_s + a.e2e_ms / 1000 - 1e-6
            assert b.prompt_tokens >= a.prompt_tokens + a.completion_tokens + 134 - 2
            assert b.cached_tokens >= a.cached_tokens
    hits = [row["cached_tokens_mean"] for row in t.summary.by_turn]
    assert hits[0] < hits[1] < hits[2]


@pytest.mark.parametrize("position", ["before_text", "after_text"])
def test_a_sessions_history_carries_its_earlier_images_and_the_cache_keeps_them(position) -> None:
    """A user who sent an image in turn 0 sends it again with the history of every later turn, where it was
    (a chat client re-sends the whole conversation): the server counts its tokens each time and, with the
    radix cache, serves them from the cache; the text ahead of the first image is the system prompt and,
    with the image after the text, turn 0's text too."""
    from servetune.multimodal import summarize_images
    from servetune.workload.spec import Images

    s = spec().model_copy(update={"images": Images(count=1, width=224, height=224, ratio=1.0, position=position)})
    batch = build_requests(s, 8)
    turn0, turn2 = batch.requests[0], batch.requests[2]
    assert len(turn2.history_images) == 2 and turn2.all_images[0] == turn0.images[0] and len(turn2.all_images) == 3
    body = orjson.loads(request_body(Target(url="http://127.0.0.1:1", endpoint="chat"), turn2))
    users = [m for m in body["messages"] if m["role"] == "user"]
    assert [sum(p.get("type") == "image_url" for p in m["content"]) for m in users] == [1, 1, 1]
    assert users[0]["content"] == turn0.chat_messages()[-1]["content"]  # turn 0's message, as it was sent
    assert turn2.new_record(False).n_images == 3
    assert turn2.text_before_images() == turn0.text_before_images()
    res = simulate({"model_profile": "llava-8b", "gpu_profile": "H200", "enable_cache_report": True},
                   batch.requests, LoadConfig(concurrency=2), rules=ValidityRules(min_window_s=0, min_completions=1))
    for a, b in (pair for rs in by_session(res.records).values() for pair in zip(rs, rs[1:], strict=False)):
        assert b.cached_tokens >= a.prompt_tokens + a.completion_tokens - 1  # the history, images and all
    mm = summarize_images(res.records)
    from servetune.sim.profiles import load_model_profile

    # per image, not per request: the history's images are counted as images (template measured on none: 0)
    per_image = load_model_profile("llava-8b").image_tokens(224, 224)
    assert abs(mm.image_tokens_per_image_p50 - per_image) <= 0.02 * per_image + 8
    assert mm.hit_rate_image_tokens > 0.5  # three of four turns find their earlier images in the cache
