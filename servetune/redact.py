"""The one redaction policy: what counts as a secret, and how it is masked wherever data leaves the process.

Every boundary (result files, warehouse rows, the report, log lines, printed commands) calls this
module, so a secret-like name, an env value or a URL password is treated the same everywhere.
Masked values read ``***``. Stdlib only: the library's lowest layers import it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

MASK = "***"
#: known secret values shorter than this are not searched for in free text (``1`` would hide every digit)
MIN_KNOWN = 8

_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials", "cookie", "cookies",
    "authorization", "auth", "oauth", "authentication", "apikey", "bearer", "jwt", "signature", "privatekey",
    "sessionkey", "accesskey", "secretkey", "apitoken",
})
#: ``<word>_key`` is a secret for these words (``api_key``, ``private-key``, ``sessionKey``...)
_KEY_PREFIXES = frozenset({"api", "private", "session", "access", "secret", "signing", "encryption", "master",
                           "auth", "client", "account", "ssh", "admin"})
#: ``<word>_token`` names a token *count or id* for these words, not a credential
_TOKEN_NOT = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "stop", "special", "first", "last",
                        "next", "start", "end", "image", "video", "audio", "max", "min", "num", "per", "new",
                        "cached", "cache", "pending", "prompt", "input", "output", "total", "generated", "decode",
                        "prefill", "extend", "draft", "accepted", "context", "kv", "reserved", "chunk"})
#: a name ending in one of these refers to a secret (its variable, file, header, count), it does not hold one
_REFERENCE = frozenset({"env", "var", "name", "names", "file", "path", "dir", "source", "sources", "header",
                        "type", "mode", "level", "count", "counts", "len", "length", "ratio", "usage", "id", "ids",
                        "limit", "size", "url", "enabled", "required", "policy", "kind", "format", "method"})


def words(name: str) -> list[str]:
    """``HF_TOKEN`` -> [hf, token]; ``apiKey`` -> [api, key]; ``--admin-api-key`` -> [admin, api, key]."""
    return [w.lower() for w in _SPLIT.split(name) if w]


def is_secret_key(name: str) -> bool:
    """A mapping key, flag or query parameter whose value is a credential (case and ``-``/``_`` do not matter).

    ``api_key``, ``hf_token``, ``Password``, ``private-key``, ``session_key``, ``cookie``, ``authorization``
    are; ``max_tokens``, ``tokenizer_path``, ``token_count_source``, ``api_key_env`` are not."""
    ws = words(name)
    if not ws or ws[-1] in _REFERENCE:
        return False
    if any(w in _SECRET_WORDS for w in ws):
        return True
    if any(a in _KEY_PREFIXES and b in ("key", "keys") for a, b in zip(ws, ws[1:], strict=False)):
        return True
    last = ws[-1]
    return last.endswith("token") and not (len(ws) > 1 and ws[-2] in _TOKEN_NOT) and last not in _TOKEN_NOT


def _count(name: str, value: Any) -> bool:
    """A number under a ``*_token`` name is a token count (SGLang's ``#token``), never a credential."""
    return isinstance(value, int | float) and not isinstance(value, bool) and words(name)[-1].endswith("token")


def is_env_key(name: str) -> bool:
    """``env``, ``extra_env``, ``env_vars``: every value under it is masked, named like a secret or not."""
    ws = words(name)
    return bool(ws) and (ws[-1] in ("env", "envvars") or ws[-2:] == ["env", "vars"])


def _masked(value: Any) -> Any:
    """What a secret-named entry stores: nothing to hide in ``None``, ``""`` or a switch."""
    return value if value is None or value == "" or isinstance(value, bool) else MASK


def mask_env(env: Any) -> Any:
    """Every value ``***``: ``{K: V}``, ``[{"name": K, "value": V}]`` (a pod spec) or ``["K=V"]``."""
    if isinstance(env, Mapping):
        return {k: MASK for k in env}
    if isinstance(env, list | tuple):
        out: list[Any] = []
        for item in env:
            if isinstance(item, Mapping):
                out.append({k: (MASK if k == "value" else v) for k, v in item.items()})
            elif isinstance(item, str) and "=" in item:
                out.append(item.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(MASK)
        return out
    return _masked(env)


def redact(value: Any, known: Iterable[str] = ()) -> Any:
    """A copy of ``value`` safe to store or show: secret-named entries and env values ``***``, URLs and text
    cleaned (``redact_text``), recursively through dicts, lists and tuples."""
    known = tuple(known)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and is_env_key(k) and isinstance(v, Mapping | list | tuple):
                out[k] = mask_env(v)
            elif isinstance(k, str) and is_secret_key(k) and not _count(k, v):
                out[k] = _masked(v)
            else:
                out[k] = redact(v, known)
        return out
    if isinstance(value, list):
        return [redact(v, known) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v, known) for v in value)
    if isinstance(value, str):
        return redact_text(value, known)
    return value


def drop_secrets(value: Any) -> Any:
    """A copy without the secret-named entries at all (a server's own account of its arguments)."""
    if isinstance(value, Mapping):
        return {k: drop_secrets(v) for k, v in value.items()
                if not (isinstance(k, str) and is_secret_key(k) and not _count(k, v))}
    if isinstance(value, list | tuple):
        return [drop_secrets(v) for v in value]
    return value


# --- free text: URLs, key=value pairs, --flag value, Authorization headers, known values
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s'\"<>`]+)")
_PARAM = re.compile(r"(?P<name>[^&;=?#]+)=(?P<value>[^&;#]*)")
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'[^']*'"
_KV = re.compile(r"(?P<key>[A-Za-z_][\w.-]*)(?P<q>[\"']?)(?P<sep>[ \t]*[=:][ \t]*)"
                 rf"(?P<value>{_QUOTED}|(?:(?:Bearer|Basic|Token)[ \t]+)?[^\s,;&'\"}}\])]+)")
_FLAG = re.compile(r"(?P<flag>(?<![\w-])--?[A-Za-z][\w-]*)(?P<sep>=|[ \t]+|['\"],[ \t]*['\"])"
                   rf"(?P<value>{_QUOTED}|[^\s'\"]+)")
_SCHEME = re.compile(r"\b(?P<scheme>Bearer)[ \t]+(?P<value>[A-Za-z0-9._~+/=-]{8,})")  # "Basic" is also English
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")


def _requote(value: str) -> str:
    return value[0] + MASK + value[0] if value[:1] in ("'", '"') and len(value) > 1 else MASK


def _mask_params(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        return f"{m['name']}={MASK}" if is_secret_key(unquote(m["name"])) and m["value"] else m.group(0)

    return _PARAM.sub(one, text)


def redact_url(url: str) -> str:
    """``scheme://user:***@host/...?token=***``: the userinfo password (an ``@`` in it included) and every
    secret-named query or fragment parameter masked; a user name alone is kept."""
    m = _URL.match(url)
    if not m:
        return url
    rest = m["rest"]
    at = rest.rfind("@")
    if at > 0:
        userinfo, host = rest[:at], rest[at + 1:]
        colon = userinfo.find(":")
        slash = min((i for i in (userinfo.find(c) for c in "/?#") if i >= 0), default=len(userinfo))
        if 0 <= colon < slash:
            rest = f"{userinfo[:colon]}:{MASK}@{host}"
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if cut >= 0:
        rest = rest[:cut] + _mask_params(rest[cut:])
    return m["scheme"] + rest + url[m.end():]


def _kv(m: re.Match[str]) -> str:
    key, value = m["key"], m["value"]
    if not is_secret_key(key) or value.strip("'\"") == MASK:
        return m.group(0)
    if words(key)[-1].endswith("token") and _NUMBER.fullmatch(value):
        return m.group(0)  # SGLang's "#token: 9000" is a count
    return f"{key}{m['q']}{m['sep']}{_requote(value)}"


def _flag(m: re.Match[str]) -> str:
    value = m["value"]
    if not is_secret_key(m["flag"].lstrip("-")) or value.startswith("-") or value.strip("'\"") == MASK:
        return m.group(0)
    return f"{m['flag']}{m['sep']}{_requote(value)}"


def scrub(text: str, known: Iterable[str]) -> str:
    """``text`` with every known secret value (long enough to be one) replaced by ``***``."""
    for secret in sorted({k for k in known if isinstance(k, str) and len(k) >= MIN_KNOWN}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """Free text (a log line, an error, a command) with known values, URL passwords and secret query
    parameters, ``key=value`` / ``key: value`` pairs, ``--secret-flag value`` and bearer tokens masked."""
    text = scrub(text, known)
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    if "=" in text or ":" in text:
        text = _KV.sub(_kv, text)
    if "-" in text:
        text = _FLAG.sub(_flag, text)
    if "Bearer" in text:
        text = _SCHEME.sub(lambda m: f"{m['scheme']} {MASK}" if m["value"] != MASK else m.group(0), text)
    return text


# --- argv: what is shown, and what must leave it before a process starts
_ENV_ASSIGN = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)", re.DOTALL)


def _flag_name(token: str) -> str | None:
    return token.split("=", 1)[0] if token.startswith("-") and len(token) > 1 and not _NUMBER.fullmatch(token) \
        else None


def redact_argv(argv: Sequence[str], known: Iterable[str] = (), *, text: bool = True,
                env_names: Iterable[str] = ()) -> list[str]:
    """``argv`` to show: ``--api-key X`` / ``--api-key=X`` / ``HF_TOKEN=X`` -> ``***``; with ``text`` each word
    also through ``redact_text`` (URLs...); ``env_names``: in a leading ``env K=V ...`` these variables are
    masked whatever their name (an engine's env values may hold tokens no name gives away)."""
    known, names = tuple(known), set(env_names)
    out: list[str] = []
    mask_next = False
    prefix = bool(names)
    for tok in argv:
        if prefix:
            assign = _ENV_ASSIGN.fullmatch(tok)
            if (tok == "env" and not out) or assign:
                hide = assign is not None and (assign["name"] in names or is_secret_key(assign["name"]))
                out.append(f"{assign['name']}={MASK}" if hide else tok)
                continue
            prefix = False
        if mask_next and _flag_name(tok) is None:
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        name = _flag_name(tok)
        assign = _ENV_ASSIGN.fullmatch(tok) if name is None else None
        if name is not None and "=" in tok and is_secret_key(name.lstrip("-")):
            tok = f"{name}={MASK}"
        elif name is not None and is_secret_key(name.lstrip("-")):
            mask_next = True
        elif assign and is_secret_key(assign["name"]):
            tok = f"{assign['name']}={MASK}"
        out.append(redact_text(tok, known) if text else tok)
    return out


def split_secret_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` without its secret-named flags, and those flags (``{"api-key": value}``), for a launch that
    passes them through the environment or a 0600 file instead."""
    kept: list[str] = []
    found: dict[str, str] = {}
    it = iter(range(len(argv)))
    for i in it:
        tok = argv[i]
        name = _flag_name(tok)
        if name is None or not is_secret_key(name.lstrip("-")):
            kept.append(tok)
        elif "=" in tok:
            found[name.lstrip("-")] = tok.split("=", 1)[1]
        elif i + 1 < len(argv) and _flag_name(argv[i + 1]) is None:
            found[name.lstrip("-")] = argv[i + 1]
            next(it)
        else:
            kept.append(tok)  # a switch without a value: nothing secret in it
    return kept, found


def known_secrets(env: Mapping[str, Any] | None = None, argv: Sequence[str] = (),
                  values: Mapping[str, Any] | None = None) -> set[str]:
    """The secret values a launch holds (every env value, secret flags in argv, secret-named entries of
    ``values``), to be scrubbed from logs and log tails that only a value, not a name, gives away."""
    out = {str(v) for v in (env or {}).values() if v is not None}
    out |= set(split_secret_flags(list(argv))[1].values())
    out |= {str(v) for k, v in (values or {}).items() if is_secret_key(str(k)) and v not in (None, "", True, False)}
    return {v for v in out if len(v) >= MIN_KNOWN}


# --- log lines: one hook for every logger of the process
_KNOWN: set[str] = set()
_installed = False


def remember(values: Iterable[str]) -> None:
    """Add values that log lines must never show (a launch's env and secret flags)."""
    _KNOWN.update(v for v in values if isinstance(v, str) and len(v) >= MIN_KNOWN)


def install_log_redaction() -> None:
    """Every log record of this process goes through ``redact_text`` (with the remembered values) once formatted.

    A record factory, not a handler filter, so handlers added later (pytest, Airflow) are covered too."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report, not ours
            return record
        clean = redact_text(message, _KNOWN)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
