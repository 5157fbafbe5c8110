"""vLLM on the CPU through servetune's engine + local runner: a real engine we did not write."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serves_one_request_with_the_flags_we_set(vllm_server):
    running = vllm_server.running
    argv = running.argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"} <= set(argv)
    # the server's own account (from /v1/models): our served name and context length
    models = running.resolved_args["models"]
    assert models[0]["id"] == "tiny" and models[0]["max_model_len"] == 2048
    body = {"model": "tiny", "prompt": "def main():", "max_tokens": 4, "temperature": 0}
    req = urllib.request.Request(vllm_server.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    assert out["usage"]["completion_tokens"] == 4 and out["usage"]["prompt_tokens"] > 0
    assert "prompt_tokens_details" in out["usage"]  # --enable-prompt-tokens-details took effect
    running.check_alive()
    assert running.preflight().ok  # its own processes are not "foreign"
