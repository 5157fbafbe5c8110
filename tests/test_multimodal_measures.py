"""What a trial with images measures (servetune.multimodal): image tokens from the server's usage, the prefix
hit rate split into image and text tokens by where the images sit, payload sizes and the TTFT breakdown;
by hand on records, then end to end through `servetune bench` against the simulated VLM over HTTP."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.multimodal import summarize_images, ttft_breakdown
from servetune.records import RequestRecord
from servetune.result import TrialResult
from servetune.validation.checklist import validate
from test_sim_http import _start


def _rec(i, *, prompt, asked, cached, images=0, before=None, payload=1000, ttft=100.0) -> RequestRecord:
    return RequestRecord(request_id=i, prompt_tokens=prompt, requested_input_tokens=asked, cached_tokens=cached,
                         n_images=images, text_before_images=before, payload_bytes=payload, ttft_ms=ttft,
                         completion_tokens=8, http_status=200)


def test_image_tokens_and_the_split_by_hand() -> None:
    recs = [
        _rec(0, prompt=110, asked=100, cached=64),  # text: the template costs 10 tokens
        _rec(1, prompt=112, asked=102, cached=0),
        # 64 text tokens ahead of 2 images of 500 tokens, then text: 100 + 1000 + 10 = 1110
        _rec(2, prompt=1110, asked=100, cached=64 + 1000, images=2, before=64, payload=400_000, ttft=900.0),
        _rec(3, prompt=1110, asked=100, cached=64, images=2, before=64, payload=400_000, ttft=1500.0),
        _rec(4, prompt=1110, asked=100, cached=30, images=2, before=64, payload=410_000, ttft=1600.0),
    ]
    mm = summarize_images(recs)
    assert mm.template_tokens == 10 and mm.template_source == "text requests"
    assert mm.image_tokens_per_image_p50 == 500
    assert mm.image_token_share == pytest.approx(3000 / (110 + 112 + 3 * 1110))
    assert mm.hit_rate_image_tokens == pytest.approx(1000 / 3000)  # only request 2 reached its images
    text_cached, text_total = 64 + 0 + 64 + 64 + 30, 110 + 112 + 3 * 110
    assert mm.hit_rate_text_tokens == pytest.approx(text_cached / text_total)
    assert mm.ttft_p50_ms.image_hit == 900.0 and mm.ttft_p50_ms.image_miss == 1600.0
    assert mm.payload_bytes_p50.model_dump() == {"text": 1000, "image": 400_000} and mm.payload_bytes_max == 410_000
    assert summarize_images(recs[:2]) is None  # a text trial has no multimodal figures
    # every request with images: no template measure, said so
    assert summarize_images(recs[2:]).template_source.startswith("none")


def test_the_breakdown_names_where_the_first_token_waits() -> None:
    recs = [_rec(i, prompt=10, asked=10, cached=0, ttft=1000.0) for i in range(4)]
    parts = ttft_breakdown(recs, {"server_ttft_mean_s": 0.95, "server_queue_mean_s": 0.2})
    assert parts.queue == pytest.approx(200) and parts.in_server_after_queue == pytest.approx(750)
    assert parts.outside_server == pytest.approx(50) and parts.dominant == "in_server_after_queue"
    assert ttft_breakdown(recs, {}) is None  # no server histogram: nothing is guessed


async def _bench(url: str, workload, out) -> dict:
    args = ["bench", "--url", url, "--concurrency", "2", "--requests", "24", "--warmup", "2", "--out", str(out),
            "--workload", str(workload), "--model", "llava-8b", "--min-window-s", "0.2", "--min-completions", "8"]
    r = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert r.exit_code == 0, r.output
    return orjson.loads(out.read_bytes())


@pytest.mark.parametrize("position, pool, image_hits, transport",
                         [("before_text", 1, True, "data_url"), ("before_system", 0, False, "data_url"),
                          ("before_text", 1, True, "http")])
async def test_bench_against_the_simulated_vlm_measures_images(tmp_path, position, pool, image_hits,
                                                                transport) -> None:
    wl = tmp_path / "vlm.yaml"
    wl.write_text("name: vlm\nseed: 2\ninput: {kind: fixed, value: 200}\noutput: {kind: fixed, value: 4}\n"
                  "shared_prefix: {tokens: 96, share_ratio: 1.0, num_prefixes: 1}\n"
                  f"images: {{count: 1, width: 448, height: 448, ratio: 0.5, distinct: {pool},"
                  f" position: {position}, format: jpeg, transport: {transport}}}\n")
    server, _ = await _start({"model_profile": "llava-8b", "enable_cache_report": True, "enable_metrics": True})
    try:
        data = await _bench(f"http://127.0.0.1:{server.port}", wl, tmp_path / "r.json")
    finally:
        await server.close()
    mm = data["summary"]["multimodal"]
    assert mm["image_requests"] > 0 and mm["text_requests"] > 0 and mm["template_source"] == "text requests"
    # 448 * 448 / 196 = 1024, the profile's count, from usage (before_system: the images' own message wrapper, 4
    # template tokens the text requests do not have, counts on their side)
    assert mm["image_tokens_per_image_p50"] == (1028 if position == "before_system" else 1024)
    assert 0.5 < mm["image_token_share"] < 0.9
    recs = [r for r in data["records"] if r["n_images"]]
    assert all(r["text_before_images"] == (0 if position == "before_system" else 96) for r in recs)
    if transport == "data_url":
        assert mm["payload_bytes_p50"]["image"] > 10 * mm["payload_bytes_p50"]["text"]  # base64 JPEG
    else:  # the URL of the client's image server instead: a few dozen bytes more than the text
        assert mm["payload_bytes_p50"]["image"] < mm["payload_bytes_p50"]["text"] + 200
    if image_hits:  # one pooled image behind a shared system prompt: cached from its second send
        assert mm["hit_rate_image_tokens"] > 0.8 and mm["ttft_p50_ms"]["image_hit"] is not None
    else:  # a unique image ahead of everything: nothing of it, and nothing after it, is reused
        # (the few template tokens that open every prompt are shared, and land on the images' side)
        assert mm["hit_rate_image_tokens"] < 0.01 and mm["ttft_p50_ms"]["image_hit"] is None
    assert mm["ttft_breakdown_ms"]["queue"] is not None and mm["ttft_breakdown_ms"]["dominant"]
    failed = [r for r in validate(TrialResult.from_dict(data), min_measured=8).results
              if r.checklist == "images" and not r.success]
    assert not failed, failed


def test_diagnose_names_where_a_kept_real_vlm_trials_first_token_waits(tmp_path) -> None:
    """Real SGLang 0.5.17 serving the VLM on an H200 (tests/data/gpu-h200-vlm/2026-12-04): with the radix
    cache on, the scheduler's queue is nearly empty and the time goes inside the server after it (the
    multimodal front end), as docs/gpu.md concludes; the results predate the summary section, so the
    figures come from their records and scrapes."""
    import tarfile
    from pathlib import Path

    with tarfile.open(Path(__file__).parent / "data/gpu-h200-vlm/2026-12-04/trials.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    res = CliRunner().invoke(app, ["diagnose", "--json", str(tmp_path / "trials/on/vlm-radix-r90-s1.json")])
    assert res.exit_code == 0, res.output
    (top,) = [f for f in orjson.loads(res.output) if f["kind"].startswith("images.ttft_")]
    assert top["kind"] == "images.ttft_in_server_after_queue", top
    assert top["summary"].startswith("the first token waits mostly in the server after its queue")
    assert top["evidence"]["queue"] < 0.1 * top["evidence"]["in_server_after_queue"]
    # the server counted about 1,026 tokens for each 896x896 image (Qwen2.5-VL: (896 / 28)^2 + 2)
    assert abs(top["evidence"]["image_tokens_per_image_p50"] - 1026) <= 4


def test_the_report_has_an_images_section_only_for_trials_with_images(tmp_path) -> None:
    import tarfile
    from pathlib import Path

    with tarfile.open(Path(__file__).parent / "data/gpu-h200-vlm/2026-12-04/trials.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data",
                       members=[m for m in tar.getmembers() if m.name.startswith("trials/on/")])
    folder = tmp_path / "camp/trials"  # a folder of loose trial results: the report's campaign view
    (tmp_path / "camp").mkdir()
    (tmp_path / "trials/on").rename(folder)
    res = CliRunner().invoke(app, ["report", str(folder.parent), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "rep/report.html").read_text()
    assert 'id="images"' in html and html.count('class="images"') == len(list(folder.glob("*.json")))
    assert "in the server after its queue (front end, vision encoder, prefill)" in html
    text = tmp_path / "text.json"
    text.write_bytes(orjson.dumps({**orjson.loads((folder / "vlm-radix-r90-s1.json").read_bytes()), "records": [
        {**r, "n_images": 0} for r in orjson.loads((folder / "vlm-radix-r90-s1.json").read_bytes())["records"]]}))
    res = CliRunner().invoke(app, ["report", str(text), "--out", str(tmp_path / "rep2")])
    assert res.exit_code == 0, res.output
    assert 'id="images"' not in (tmp_path / "rep2/report.html").read_text()


async def test_images_over_http_are_fetched_by_the_server_and_shrink_the_payload() -> None:
    """Target.images_over_http: each distinct image served once per load from the client's host, the engine
    (here the simulated one, which fetches URLs as SGLang's loader does) counts the same image tokens."""
    import time

    from servetune.loadgen import LoadConfig, Target, run_load
    from servetune.workload import WorkloadSpec, build_requests
    from servetune.workload.lengths import Fixed
    from servetune.workload.spec import Images

    spec = WorkloadSpec(input=Fixed(value=50), output=Fixed(value=4), seed=5,
                        images=Images(count=1, width=448, height=448, distinct=2, format="jpeg"))
    reqs = build_requests(spec, 6).requests
    server, _ = await _start({"model_profile": "llava-8b", "enable_cache_report": True})
    url = f"http://127.0.0.1:{server.port}"
    try:
        inline = await run_load(Target(url=url), reqs, LoadConfig(concurrency=1), t0_ns=time.perf_counter_ns())
        by_url = await run_load(Target(url=url, images_over_http=True), reqs, LoadConfig(concurrency=1),
                                t0_ns=time.perf_counter_ns())
    finally:
        await server.close()
    for a, b in zip(inline.records, by_url.records, strict=True):
        assert a.ok and b.ok, (a.error_message, b.error_message)
        assert a.prompt_tokens == b.prompt_tokens  # the same image, the same tokens
        assert b.payload_bytes < 2000 < 10 * 2000 < a.payload_bytes  # a URL instead of a base64 JPEG
    assert reqs[0].images[0].startswith("data:")  # the workload itself is left as built
