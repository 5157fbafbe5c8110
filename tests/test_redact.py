"""The redaction policy (servetune.redact) on its own: names, nesting, URLs, argv, env, logs, and the
boundaries that are plain functions (saving a result, the warehouse URL, the launch's secret move)."""

from __future__ import annotations

import logging
import os
import stat

import orjson
import pytest
import yaml
from sqlalchemy.engine import make_url

from servetune import localdb
from servetune.engines import SGLangConfig, SimConfig, VLLMConfig
from servetune.engines.sglang import SECRETS_FILE as SGLANG_SECRETS
from servetune.redact import (
    MASK,
    drop_secrets,
    install_log_redaction,
    is_secret_key,
    known_secrets,
    redact,
    redact_argv,
    redact_text,
    remember,
    split_secret_flags,
)
from servetune.result import TrialResult
from servetune.runners.base import LocalRunnerConfig
from servetune.runners.lifecycle import secure_launch
from servetune.runners.local import LocalBackend
from servetune.warehouse import db

SECRET_NAMES = ["token", "api_key", "api-key", "apikey", "API_KEY", "x-api-key", "apiKey", "secret", "client_secret",
                "password", "Password", "passwd", "DB_PASSWORD", "private_key", "private-key", "session_key",
                "sessionKey", "cookie", "Set-Cookie", "authorization", "Authorization", "credential", "credentials",
                "access_key", "AWS_SECRET_ACCESS_KEY", "hf_token", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "GITHUB_TOKEN", "admin-api-key", "admin_api_key", "ssl-keyfile-password", "bearer", "auth"]
NOT_SECRETS = ["max_tokens", "tokens", "tokenizer", "tokenizer_path", "skip_tokenizer_init", "token_count_source",
               "token_count_sources", "prompt_tokens", "cached_tokens", "chunk_tokens", "tokens_per_request",
               "server_token_usage_max", "token_usage", "new_token", "cached_token", "num_token", "eos_token_id",
               "bos_token", "api_key_env", "ssl_keyfile", "key", "config_key", "secret_name", "HF_TOKEN_PATH",
               "model", "url", "endpoint", "chunked-prefill-size", "keyboard", "monkey", "tokenize"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_like_names(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_names_that_only_look_alike(name: str) -> None:
    assert not is_secret_key(name)


def test_nested_dicts_lists_and_tuples_are_masked_not_dropped() -> None:
    data = {"a": [{"cookie": "c1", "n": 1}, ({"session_key": "s1"}, "plain")],
            "b": {"c": {"private_key": "-----BEGIN", "max_tokens": 5, "token_usage": 0.5}},
            "api_key": None, "password": "", "auth": True, "new_token": 1600}
    out = redact(data)
    assert out == {"a": [{"cookie": MASK, "n": 1}, ({"session_key": MASK}, "plain")],
                   "b": {"c": {"private_key": MASK, "max_tokens": 5, "token_usage": 0.5}},
                   "api_key": None, "password": "", "auth": True, "new_token": 1600}
    assert redact(out) == out  # idempotent: a stored result loads and hashes the same
    assert drop_secrets(data)["a"][0] == {"n": 1}


def test_every_env_value_is_masked_whatever_its_name() -> None:
    plan = {"engine": {"env": {"HF_TOKEN": "hf_1", "MY_OPAQUE_SETTING": "x9", "CUDA_VISIBLE_DEVICES": "0"}},
            "extra_env": {"A": "1"}, "pod": {"env": [{"name": "K", "value": "v"}], "env_vars": ["K=V"]}}
    out = redact(plan)
    assert out["engine"]["env"] == {"HF_TOKEN": MASK, "MY_OPAQUE_SETTING": MASK, "CUDA_VISIBLE_DEVICES": MASK}
    assert out["extra_env"] == {"A": MASK}
    assert out["pod"] == {"env": [{"name": "K", "value": MASK}], "env_vars": ["K=" + MASK]}
    assert redact({"api_key_env": "SERVETUNE_API_KEY"}) == {"api_key_env": "SERVETUNE_API_KEY"}  # a name, not a key


@pytest.mark.parametrize(("url", "shown", "hidden"), [
    ("postgresql+psycopg://wh:s3cret@db:5432/w", "postgresql+psycopg://wh:***@db:5432/w", "s3cret"),
    ("postgresql://wh:p@ss@w0rd@db.example:5433/w?sslmode=require", "postgresql://wh:***@db.example:5433/w"
     "?sslmode=require", "ss@w0rd"),
    ("postgresql://u:a/b?c#d@h/db", "postgresql://u:***@h/db", "a/b"),
    ("http://127.0.0.1:8000/v1?token=t0k3n&x=1&api_key=k3y", "http://127.0.0.1:8000/v1?token=***&x=1&api_key=***",
     "t0k3n"),
    ("https://h/cb#access_token=abc123xyz&state=1", "https://h/cb#access_token=***", "abc123xyz"),
    ("postgresql://postgres@127.0.0.1:5432/postgres", "postgresql://postgres@127.0.0.1:5432/postgres", None),
])
def test_urls_lose_passwords_and_secret_parameters(url: str, shown: str, hidden: str | None) -> None:
    text = f"could not connect to {url} (timeout)"
    out = redact_text(text)
    assert out.startswith(f"could not connect to {shown}")
    if hidden:
        assert hidden not in out
    assert redact({"url": url})["url"] == redact_text(url)


def test_free_text_forms() -> None:
    assert redact_text("Authorization: Bearer sk-live-123456") == "Authorization: ***"
    assert redact_text("sent Bearer sk-live-123456 to it") == "sent Bearer *** to it"
    assert redact_text('{"api_key": "abc", "n": 1}') == '{"api_key": "***", "n": 1}'
    assert redact_text("host=db password=hunter2 dbname=w") == "host=db password=*** dbname=w"
    assert redact_text("HF_TOKEN=hf_abc python -m x") == "HF_TOKEN=*** python -m x"
    assert redact_text("['--api-key', 'k3y', '--port', '1']") == "['--api-key', '***', '--port', '1']"
    decode = "Decode batch. #running-req: 4, #token: 9000, token usage: 0.07, cuda graph: True"
    assert redact_text(decode) == decode  # SGLang's counts stay readable
    assert redact_text("value sk-abcdefgh1 seen", known=["sk-abcdefgh1", "1"]) == "value *** seen"  # "1": too short


def test_argv_forms() -> None:
    argv = ["env", "HF_TOKEN=hf_1", "OPAQUE=o1", "CUDA_VISIBLE_DEVICES=0", "python", "-m", "sglang.launch_server",
            "--api-key", "k1", "--admin-api-key=k2", "--port", "30000", "--ssl-keyfile-password", "pw",
            "--db", "postgresql://u:p@ss@h/d", "--api-key-env", "NAME", "SECRET_TOKEN=inline"]
    out = redact_argv(argv, env_names={"HF_TOKEN", "OPAQUE"})
    assert out == ["env", "HF_TOKEN=***", "OPAQUE=***", "CUDA_VISIBLE_DEVICES=0", "python", "-m",
                   "sglang.launch_server", "--api-key", "***", "--admin-api-key=***", "--port", "30000",
                   "--ssl-keyfile-password", "***", "--db", "postgresql://u:***@h/d", "--api-key-env", "NAME",
                   "SECRET_TOKEN=***"]
    script = ["python", "-c", "token = 'x'\nprint(token)", "--api-key", "k1"]
    assert redact_argv(script, text=False) == ["python", "-c", "token = 'x'\nprint(token)", "--api-key", "***"]


def test_split_secret_flags_takes_both_spellings_and_leaves_switches() -> None:
    kept, found = split_secret_flags(["x", "--api-key", "k1", "--admin-api-key=k2", "--port", "1", "--api-key"])
    assert kept == ["x", "--port", "1", "--api-key"] and found == {"api-key": "k1", "admin-api-key": "k2"}
    assert known_secrets(env={"A": "short", "B": "long-enough-1"}, argv=["--api-key", "k1-long-key"],
                         values={"api-key": "from-args-123", "port": 30000}) == {
        "long-enough-1", "k1-long-key", "from-args-123"}


def test_log_lines_are_redacted_for_every_logger(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    remember(["opaque-value-no-name-gives-away"])
    other = logging.getLogger("some.library")
    with caplog.at_level(logging.INFO):
        other.info("connecting to %s with %s", "postgresql://u:pw-in-url@h/db", "opaque-value-no-name-gives-away")
        other.info("argv %s", ["--api-key", "k-in-argv"])
    text = caplog.text
    assert "pw-in-url" not in text and "opaque-value" not in text and "k-in-argv" not in text
    assert text.count(MASK) == 3


def test_a_saved_result_holds_no_secret(tmp_path) -> None:
    trial = TrialResult(target={"url": "http://u:url-pass-1@127.0.0.1:1", "api_key_env": "MY_KEY"},
                        server_config={"api-key": "flag-secret-1", "max-running-requests": 8},
                        failure_reason="server failed: --api-key flag-secret-1 rejected")
    path = trial.save(tmp_path / "t.json")
    text = path.read_text()
    assert "url-pass-1" not in text and "flag-secret-1" not in text
    back = TrialResult.read(path)
    assert back.server_config == {"api-key": MASK, "max-running-requests": 8}
    assert back.target == {"url": "http://u:***@127.0.0.1:1", "api_key_env": "MY_KEY"}
    assert back.to_dict() == orjson.loads(path.read_bytes())  # reading and saving again changes nothing
    assert trial.server_config["api-key"] == "flag-secret-1"  # the object in memory still launches the engine


def test_a_database_password_with_a_raw_at_sign_parses_and_never_shows() -> None:
    raw = "postgresql://wh:p@ss@w0rd@db.example:6543/warehouse?sslmode=require"
    url = db.resolve_url(raw)
    parsed = make_url(url)
    assert (parsed.password, parsed.host, parsed.port) == ("p@ss@w0rd", "db.example", 6543)
    for shown in (db.redact(url), db.redact(raw), localdb.redact(raw)):
        assert "ss@w0rd" not in shown and "p@ss" not in shown and "wh:***@db.example" in shown
    assert db.resolve_url("postgresql://wh:s%40cret@h/d") == "postgresql+psycopg://wh:s%40cret@h/d"  # unchanged


def test_secret_flags_leave_the_command_line() -> None:
    vllm = VLLMConfig(model="/m", extra_args=["--api-key", "vllm-key-123", "--served-model-name", "m"])
    argv, env, files = secure_launch(vllm, vllm.launch_argv(host="127.0.0.1", port=8000))
    assert "vllm-key-123" not in argv and env["VLLM_API_KEY"] == "vllm-key-123" and not files
    assert argv[-2:] == ["--served-model-name", "m"]

    sglang = SGLangConfig(model="/m", args={"api-key": "sg-key-1234", "admin-api-key": "sg-admin-1234"},
                          env={"HF_TOKEN": "hf_x"}, parser_check=False)
    argv, env, files = secure_launch(sglang, sglang.launch_argv(host="127.0.0.1", port=30000))
    assert not any("sg-" in a for a in argv) and env == {"HF_TOKEN": "hf_x"}
    assert yaml.safe_load(files[SGLANG_SECRETS]) == {"api-key": "sg-key-1234", "admin-api-key": "sg-admin-1234"}

    sim = SimConfig(args={"api-key": "sim-key-1234"})  # the simulator reads neither: it stays, shown redacted
    argv, _, files = secure_launch(sim, sim.launch_argv(host="127.0.0.1", port=1))
    assert "sim-key-1234" in argv and not files and "sim-key-1234" not in redact_argv(argv)


def test_local_secret_files_are_private_and_go_away(tmp_path) -> None:
    backend = LocalBackend(LocalRunnerConfig())
    paths = backend.stage_secrets({SGLANG_SECRETS: "api-key: k\n"})
    path = paths[SGLANG_SECRETS]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert open(path).read() == "api-key: k\n"
    backend.on_ready()
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    dry = backend.stage_secrets({SGLANG_SECRETS: "x"}, dry_run=True)
    assert not os.path.exists(dry[SGLANG_SECRETS])
