"""Workload generator: determinism, distributions, traces, exact lengths, prefixes, images, turns."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from servetune.workload import PRESETS, WorkloadSpec, build_requests, get_preset, load_tokenizer
from servetune.workload.images import decode_data_url
from servetune.workload.lengths import LengthSampler, TraceError
from servetune.workload.spec import (
    Empirical,
    Fixed,
    Images,
    LogNormal,
    MultiTurn,
    Normal,
    SharedPrefix,
    Uniform,
)
from tokenizer_fixtures import tokenizer_path  # noqa: F401  (session fixture)


@pytest.fixture(scope="module")
def tok(tokenizer_path):  # noqa: F811
    return load_tokenizer(tokenizer_path)


def _sample(dist, n=4000, seed=0):
    s = LengthSampler(dist)
    rng = np.random.default_rng(seed)
    return np.array([s.sample(rng) for _ in range(n)])


# --- determinism -------------------------------------------------------------------------------
def test_same_spec_and_seed_give_identical_requests():
    spec = get_preset("chat-default")
    a = build_requests(spec, 40).requests
    b = build_requests(spec, 40).requests
    assert a == b
    c = build_requests(spec.model_copy(update={"seed": 1}), 40).requests
    assert [r.user for r in a] != [r.user for r in c]


def test_start_index_continues_the_same_workload():
    spec = get_preset("multi-turn-chat")
    whole = build_requests(spec, 50).requests
    tail = build_requests(spec, 20, start_index=30).requests
    assert tail == whole[30:]
    assert [r.index for r in tail] == list(range(30, 50))


# --- distributions -----------------------------------------------------------------------------
def test_fixed_and_uniform():
    assert set(_sample(Fixed(value=77), n=50)) == {77}
    u = _sample(Uniform(min=10, max=20))
    assert u.min() == 10 and u.max() == 20
    assert abs(u.mean() - 15) < 0.3


def test_normal_is_resampled_within_bounds():
    x = _sample(Normal(mean=100, std=30, min=80, max=150))
    assert x.min() >= 80 and x.max() <= 150
    # resampled, not clipped: the bound holds no spike of mass
    assert (x == 80).mean() < 0.03
    wide = _sample(Normal(mean=500, std=50, min=1, max=10_000))
    assert abs(wide.mean() - 500) < 5 and abs(wide.std() - 50) < 4


def test_normal_with_unreachable_bounds_is_a_clear_error():
    with pytest.raises(ValueError, match="almost no mass"):
        LengthSampler(Normal(mean=10, std=0.1, min=100, max=200)).sample(np.random.default_rng(0))


def test_lognormal_median_sigma_and_bounds():
    x = _sample(LogNormal(median=1000, sigma=0.5, min=1, max=100_000), n=6000)
    assert abs(np.median(x) / 1000 - 1) < 0.05
    assert abs(np.std(np.log(x)) - 0.5) < 0.03
    b = _sample(LogNormal(median=1000, sigma=0.8, min=600, max=1500))
    assert b.min() >= 600 and b.max() <= 1500


def test_bounds_out_of_order_rejected():
    with pytest.raises(ValidationError, match=r"min \(10\) > max \(3\)"):
        WorkloadSpec.model_validate(
            {"input": {"kind": "lognormal", "median": 5, "sigma": 1, "min": 10, "max": 3}}
        )


def test_unknown_distribution_kind_is_rejected_naming_the_field():
    with pytest.raises(ValidationError) as exc:
        WorkloadSpec.model_validate({"input": {"kind": "zipf", "value": 3}})
    msg = str(exc.value)
    assert "input" in msg and "'kind'" in msg and "zipf" in msg and "lognormal" in msg


# --- empirical traces --------------------------------------------------------------------------
def _write_trace(path: Path, rows: list) -> Path:
    path.write_bytes(b"\n".join(r if isinstance(r, bytes) else orjson.dumps(r) for r in rows) + b"\n")
    return path


def test_empirical_trace_samples_scaled_values_within_bounds(tmp_path):
    trace = _write_trace(
        tmp_path / "t.jsonl", [{"input_tokens": v, "other": 1} for v in (10, 20, 30, 400, 5000)]
    )
    x = _sample(Empirical(path=str(trace), field="input_tokens", scale=2.0, min=30, max=1000), n=600)
    assert set(x) == {40, 60, 800}
    assert all(abs(np.mean(x == v) - 1 / 3) < 0.07 for v in (40, 60, 800))


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([{"n": 5}, b"{not json", {"n": 6}], r"t\.jsonl, line 2: not valid JSON"),
        ([{"n": 5}, {"m": 6}], r"t\.jsonl, line 2: field 'n' is missing"),
        ([{"n": 5}, {"n": "many"}], r"t\.jsonl, line 2: field 'n' must be a number"),
        ([{"n": 5}, {"n": -3}], r"t\.jsonl, line 2: field 'n' must be > 0"),
        ([[1, 2]], r"t\.jsonl, line 1: expected a JSON object"),
    ],
)
def test_malformed_trace_errors_name_file_line_and_field(tmp_path, rows, match):
    trace = _write_trace(tmp_path / "t.jsonl", rows)
    spec = WorkloadSpec(input=Empirical(path=str(trace), field="n"), output=Fixed(value=4))
    with pytest.raises(TraceError, match=match):
        build_requests(spec, 3)


def test_missing_or_empty_trace(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.jsonl: trace file not found"):
        LengthSampler(Empirical(path=str(tmp_path / "nope.jsonl"), field="n"))
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match=r"e\.jsonl: no records"):
        LengthSampler(Empirical(path=str(tmp_path / "e.jsonl"), field="n"))
    trace = _write_trace(tmp_path / "small.jsonl", [{"n": 3}])
    with pytest.raises(TraceError, match="no value of 'n'"):
        LengthSampler(Empirical(path=str(trace), field="n", min=10))


def test_shipped_trace_sample_loads():
    spec = WorkloadSpec(
        input=Empirical(
            path=str(Path(__file__).parent / "data" / "trace_sample.jsonl"), field="input_tokens"
        ),
        output=Empirical(
            path=str(Path(__file__).parent / "data" / "trace_sample.jsonl"), field="output_tokens"
        ),
    )
    reqs = build_requests(spec, 30).requests
    assert all(len(r.prompt_text().split()) == r.input_tokens for r in reqs)


# --- lengths -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        WorkloadSpec(input=Uniform(min=8, max=3000), output=Fixed(value=8)),
        WorkloadSpec(input=LogNormal(median=600, sigma=0.9, min=16, max=6000), output=Fixed(value=8), seed=3),
        WorkloadSpec(
            input=Normal(mean=900, std=300, min=300, max=2000),
            output=Fixed(value=8),
            shared_prefix=SharedPrefix(tokens=256, share_ratio=0.6, num_prefixes=3),
        ),
    ],
    ids=["uniform", "lognormal", "normal+prefix"],
)
def test_prompts_hit_requested_token_lengths_with_a_real_tokenizer(tok, spec):
    batch = build_requests(spec, 120, tok)
    assert batch.lengths_exact and batch.tokenizer_name == "stdlib-bpe"
    unexact = 0
    for r in batch.requests:
        got = tok.count(r.prompt_text())
        assert abs(got - r.input_tokens) <= 0.02 * r.input_tokens, (r.index, got, r.input_tokens)
        unexact += got != r.input_tokens
    assert unexact <= 2  # in practice the fit lands exactly


def test_requested_lengths_follow_the_distribution_with_a_tokenizer(tok):
    spec = WorkloadSpec(input=Uniform(min=50, max=2000), output=Fixed(value=8))
    with_tok = [r.input_tokens for r in build_requests(spec, 60, tok).requests]
    without = [r.input_tokens for r in build_requests(spec, 60).requests]
    assert with_tok == without  # the same draws; only the text differs


def test_fixed_lengths_are_exact_with_a_tokenizer(tok):
    for value in (24, 100, 1000, 4096):
        spec = WorkloadSpec(input=Fixed(value=value), output=Fixed(value=8))
        for r in build_requests(spec, 5, tok).requests:
            assert r.input_tokens == value
            assert abs(tok.count(r.prompt_text()) - value) <= 0.02 * value


def test_system_prompt_length_is_exact(tok):
    spec = WorkloadSpec(input=Fixed(value=900), shared_prefix=SharedPrefix(tokens=512, num_prefixes=2))
    for r in build_requests(spec, 10, tok).requests:
        assert tok.count(r.system) == 512


def test_without_tokenizer_one_word_per_token():
    spec = WorkloadSpec(
        input=LogNormal(median=300, sigma=0.7, min=40, max=3000),
        shared_prefix=SharedPrefix(tokens=32, share_ratio=0.5),
        multi_turn=MultiTurn(turns=3, turn_input=Uniform(min=5, max=50)),
    )
    batch = build_requests(spec, 60)
    assert not batch.lengths_exact and batch.tokenizer_name is None
    for r in batch.requests:
        assert len(r.prompt_text().split()) == r.input_tokens
        words = sum(len(m["content"].split()) for m in r.chat_messages())
        assert words == r.input_tokens
        if r.system is not None:
            assert len(r.system.split()) == 32


def test_too_short_requests_are_raised_to_the_system_prompt_plus_one_word():
    spec = WorkloadSpec(input=Fixed(value=10), shared_prefix=SharedPrefix(tokens=64))
    for r in build_requests(spec, 5).requests:
        assert r.input_tokens == 64 + 2  # nonce + one word
        assert len(r.prompt_text().split()) == r.input_tokens


# --- shared prefixes ---------------------------------------------------------------------------
def test_share_ratio_and_zipf_popularity():
    spec = WorkloadSpec(
        input=Fixed(value=40),
        output=Fixed(value=4),
        shared_prefix=SharedPrefix(tokens=16, share_ratio=0.7, num_prefixes=4, zipf_s=1.2),
    )
    reqs = build_requests(spec, 4000).requests
    groups = Counter(r.prefix_group for r in reqs)
    assert abs(1 - groups[-1] / 4000 - 0.7) < 0.03
    carried = 4000 - groups[-1]
    w = np.arange(1, 5, dtype=float) ** -1.2
    expected = w / w.sum()
    for g in range(4):
        assert abs(groups[g] / carried - expected[g]) < 0.03
    assert groups[0] > groups[1] > groups[2] > groups[3]
    for r in reqs:
        assert (r.system is None) == (r.prefix_group == -1)
    systems = {r.prefix_group: r.system for r in reqs if r.prefix_group >= 0}
    assert len(set(systems.values())) == 4
    assert all(r.system == systems[r.prefix_group] for r in reqs if r.prefix_group >= 0)


def test_zipf_zero_is_uniform():
    spec = WorkloadSpec(input=Fixed(value=40), shared_prefix=SharedPrefix(tokens=8, num_prefixes=5, zipf_s=0))
    groups = Counter(r.prefix_group for r in build_requests(spec, 3000).requests)
    assert all(abs(groups[g] / 3000 - 0.2) < 0.03 for g in range(5))


def test_only_the_system_prompt_is_a_shared_prefix(tok):
    spec = WorkloadSpec(input=Fixed(value=300), shared_prefix=SharedPrefix(tokens=100, num_prefixes=1))
    reqs = build_requests(spec, 25, tok).requests
    ids = [tok.encode(r.prompt_text()) for r in reqs]
    shared = len(tok.encode(reqs[0].system + "\n"))
    common = []
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            a, b = ids[i], ids[j]
            common.append(next(k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y))
    # everyone shares the system prompt; beyond it only the first few hashed characters of a
    # nonce can coincide (birthday odds over 300 pairs; this small BPE splits hex per character)
    assert min(common) >= shared
    assert max(common) <= shared + 4 and np.mean(common) < shared + 0.5
    assert len({r.user.split()[0] for r in reqs}) == len(reqs)


def test_different_specs_never_share_user_text():
    a = build_requests(WorkloadSpec(input=Fixed(value=100)), 5).requests
    b = build_requests(WorkloadSpec(input=Fixed(value=200)), 5).requests
    assert all(x.user.split()[0] != y.user.split()[0] for x, y in zip(a, b, strict=True))


# --- images ------------------------------------------------------------------------------------
def test_images_decode_to_the_requested_size_and_are_distinct():
    spec = WorkloadSpec(input=Fixed(value=50), images=Images(count=2, width=96, height=64, ratio=1.0))
    reqs = build_requests(spec, 6).requests
    urls = [u for r in reqs for u in r.images]
    assert len(urls) == 12 and len(set(urls)) == 12
    for u in urls:
        assert u.startswith("data:image/png;base64,")
        img = decode_data_url(u)
        assert img.format == "PNG" and img.size == (96, 64)
    msgs = reqs[0].chat_messages()
    assert [p["type"] for p in msgs[-1]["content"]] == ["image_url", "image_url", "text"]


def test_image_pool_ratio_and_jpeg():
    spec = WorkloadSpec(
        input=Fixed(value=50),
        images=Images(count=1, width=64, height=48, ratio=0.5, distinct=3, format="jpeg"),
    )
    reqs = build_requests(spec, 400).requests
    with_images = [r for r in reqs if r.images]
    assert abs(len(with_images) / 400 - 0.5) < 0.08
    urls = {r.images[0] for r in with_images}
    assert len(urls) == 3
    img = decode_data_url(next(iter(urls)))
    assert img.format == "JPEG" and img.size == (64, 48)


def test_a_reuse_ratio_of_images_comes_from_the_pool_and_the_rest_are_unique():
    spec = WorkloadSpec(input=Fixed(value=50), images=Images(count=1, width=32, height=32, distinct=4,
                                                             reuse_ratio=0.25))
    urls = [r.images[0] for r in build_requests(spec, 400).requests]
    counts = Counter(urls)
    pooled = [u for u, n in counts.items() if n > 1]
    assert len(pooled) == 4  # the pool's images repeat ...
    assert abs(sum(counts[u] for u in pooled) / 400 - 0.25) < 0.06  # ... on a quarter of the requests
    assert sum(1 for n in counts.values() if n == 1) == 400 - sum(counts[u] for u in pooled)


@pytest.mark.parametrize("position", ["before_text", "after_text", "before_system"])
def test_the_image_position_decides_where_the_images_sit(position):
    spec = WorkloadSpec(input=Fixed(value=120), shared_prefix=SharedPrefix(tokens=32),
                        images=Images(count=1, width=32, height=32, position=position))
    req = build_requests(spec, 1).requests[0]
    msgs = req.chat_messages()
    layout = [(m["role"], [p["type"] for p in m["content"]] if isinstance(m["content"], list) else "text")
              for m in msgs]
    assert layout == {
        "before_text": [("system", "text"), ("user", ["image_url", "text"])],
        "after_text": [("system", "text"), ("user", ["text", "image_url"])],
        "before_system": [("user", ["image_url"]), ("system", "text"), ("user", "text")],
    }[position]


# --- multi-turn --------------------------------------------------------------------------------
@pytest.mark.parametrize("interleave", [1, 3])
def test_multi_turn_history_grows_and_resends_earlier_turns(tok, interleave):
    spec = WorkloadSpec(
        input=Uniform(min=120, max=300),
        output=Uniform(min=20, max=60),
        shared_prefix=SharedPrefix(tokens=64),
        multi_turn=MultiTurn(turns=3, turn_input=Fixed(value=30), interleave=interleave,
                             mode="scripted" if interleave > 1 else "sessions"),
    )
    reqs = build_requests(spec, 18, tok).requests
    convs: dict[int, list] = {}
    for r in reqs:
        convs.setdefault(r.conversation, []).append(r)
    assert len(convs) == 6
    for turns in convs.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        for k, r in enumerate(turns):
            assert len(r.history) == 2 * k
            assert tok.count(r.prompt_text()) == r.input_tokens
            assert r.system == turns[0].system
        for k in range(2):
            prev, nxt = turns[k], turns[k + 1]
            assert nxt.history[: 2 * k] == prev.history
            assert nxt.history[2 * k] == {"role": "user", "content": prev.user}
            answer = nxt.history[2 * k + 1]
            assert answer["role"] == "assistant"
            assert abs(tok.count(answer["content"]) - prev.output_tokens) <= 1
            # the new prompt is the old one plus an answer and a new user message
            grown = nxt.input_tokens - prev.input_tokens
            assert abs(grown - (prev.output_tokens + 30)) <= 3
    if interleave == 3:
        assert [r.conversation for r in reqs[:6]] == [0, 1, 2, 0, 1, 2]


# --- fingerprints ------------------------------------------------------------------------------
def test_fingerprint_changes_with_spec_trace_and_tokenizer(tmp_path, tok):
    trace = _write_trace(tmp_path / "t.jsonl", [{"n": 100}, {"n": 200}])
    spec = WorkloadSpec(input=Empirical(path=str(trace), field="n"), output=Fixed(value=8))
    fp = build_requests(spec, 1).fingerprint
    assert build_requests(spec, 5).fingerprint == fp
    assert build_requests(spec.model_copy(update={"seed": 9}), 1).fingerprint != fp
    assert build_requests(spec.model_copy(update={"output": Fixed(value=9)}), 1).fingerprint != fp
    assert build_requests(spec, 1, tok).fingerprint != fp
    _write_trace(trace, [{"n": 100}, {"n": 201}])
    assert build_requests(spec, 1).fingerprint != fp


# --- presets and tokenizer loading -------------------------------------------------------------
def test_presets_build_and_unknown_preset_lists_names():
    for name in PRESETS:
        spec = get_preset(name)
        assert isinstance(spec, WorkloadSpec) and spec.name == name
        reqs = build_requests(spec, 8).requests
        assert len(reqs) == 8 and all(len(r.prompt_text().split()) == r.input_tokens for r in reqs)
    chat = get_preset("chat-default")
    assert chat.shared_prefix.tokens == 512 and chat.shared_prefix.share_ratio == 0.8
    assert math.isclose(chat.input.median, 1024) and math.isclose(chat.output.median, 192)
    assert get_preset("vlm-chat").images is not None
    get_preset("chat-default").seed = 5
    assert PRESETS["chat-default"].seed == 0  # copies, not the shared object
    with pytest.raises(KeyError, match="unknown workload preset 'nope'; known presets: chat-default"):
        get_preset("nope")


def test_load_tokenizer_by_dir_or_file_and_clear_errors(tokenizer_path, tmp_path):  # noqa: F811
    by_file = load_tokenizer(tokenizer_path)
    by_dir = load_tokenizer(tokenizer_path.parent)
    assert by_file.sha256 == by_dir.sha256 and by_dir.name == "stdlib-bpe"
    text = "hello world, the quick brown fox"
    assert by_dir.decode(by_dir.encode(text)) == text and by_dir.count(text) == len(by_dir.encode(text))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"without tokenizer\.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(bad)


def test_spec_tokenizer_field_is_used(tokenizer_path):  # noqa: F811
    spec = WorkloadSpec(input=Fixed(value=300), tokenizer=str(tokenizer_path.parent))
    batch = build_requests(spec, 3)
    assert batch.lengths_exact and batch.tokenizer_name == "stdlib-bpe"


def test_batched_measurement_gives_the_same_requests_as_one_by_one(tok):
    from servetune.workload.generator import _Generator

    spec = get_preset("chat-default")
    batched = build_requests(spec, 30, tok, start_index=7).requests
    gen = _Generator(spec, tok)
    assert batched == [gen.request(i) for i in range(7, 37)]


def test_a_mixture_draws_each_length_from_a_part_by_weight() -> None:
    from servetune.workload import build_requests as build
    from servetune.workload.spec import WorkloadSpec as Spec

    spec = Spec.model_validate({"name": "mix", "seed": 4, "output": {"kind": "fixed", "value": 8}, "input": {
        "kind": "mixture", "parts": [
            {"weight": 9, "dist": {"kind": "uniform", "min": 100, "max": 400}},
            {"weight": 1, "dist": {"kind": "fixed", "value": 16000}}]}})
    lengths = [r.input_tokens for r in build(spec, 2000).requests]
    long = sum(n == 16000 for n in lengths)
    assert 150 <= long <= 250  # 10% of 2000, within sampling noise
    assert all(100 <= n <= 400 for n in lengths if n != 16000)
    assert [r.input_tokens for r in build(spec, 50).requests] == lengths[:50]  # seeded
    with pytest.raises(ValueError, match="parts"):
        Spec.model_validate({"input": {"kind": "mixture", "parts": []}})
