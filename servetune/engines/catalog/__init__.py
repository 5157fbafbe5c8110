"""Per-version flag catalogues of an engine, kept as data, so a plan is checked before a GPU is touched.

``sglang-<version>.yaml`` is generated from SGLang's own argument parser (``sglang_probe.py dump``,
see ``python -m servetune.engines.catalog --help``). Two sections are written by hand, facts the parser
of that version cannot know, and are carried over whenever a catalogue is regenerated (``__main__``) or
read from a runner (``cache_runner_catalog``):

``removed:`` which flags went away and what replaced them
(``cuda-graph-max-bs: {since: 0.5.20, replacement: cuda-graph-max-bs-decode, note: ...}``). ``limits:`` bounds
and choices argparse does not check (its ``type=int`` takes 0 and -5 alike), so a value SGLang would refuse, or
misread, fails at plan validation. Keyed by the catalogue's flag name (an alias maps to it); each limit holds any of
``ge``/``gt``/``le``/``lt`` (numbers), ``also`` (values allowed outside the bounds, e.g. ``-1`` for "off"), ``choices``,
and a ``note`` saying where the rule comes from (SGLang's ``ServerArgs`` checks, or what the value means there), e.g.
``chunked-prefill-size: {ge: 1, also: [-1], note: "-1 disables chunked prefill; ..."}``.

A value breaking one raises ``FlagError``: ``bad value 0 for --chunked-prefill-size (sglang 0.5.17): must
be -1 or >= 1 (note)``. Strings read by SGLang's ``human_readable_int`` (``128k``, ``1Mi``) are compared
as the number they stand for; a list value is checked item by item.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from servetune.names import safe_component
from servetune.strict_yaml import safe_load

CATALOG_DIR = Path(__file__).parent


def runner_catalog_dir() -> Path:
    """Where catalogues read from a runner's own engine are cached, one file per version."""
    return Path(os.environ.get("SERVETUNE_CATALOG_CACHE") or Path.home() / ".cache" / "servetune" / "catalogs")
FlagType = Literal["bool", "bool_optional", "const", "choice", "list", "int", "float", "json", "str"]
Scalar = bool | int | float | str
FlagValue = Scalar | list[Scalar] | dict[str, Any] | None

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class FlagError(ValueError):
    """A flag or value the engine version would refuse; the message names the flag and the version."""


class FlagSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: FlagType
    dest: str
    aliases: list[str] = Field(default_factory=list)
    choices: list[Scalar] | None = None
    nargs: str | int | None = None
    item_type: Literal["int", "float", "str"] | None = None
    parser: str | None = None  # a custom type function: value checked on the runner by the engine's parser
    required: bool = False
    default: Any = None
    deprecated: bool = False
    replacement: str | None = None
    help: str | None = None


class RemovedFlag(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: str
    replacement: str | None = None
    note: str | None = None


class FlagLimit(BaseModel):
    """A hand-kept bound on one flag's value (the module docstring); ``note`` says whose rule it is."""

    model_config = ConfigDict(extra="forbid")

    ge: int | float | None = None
    gt: int | float | None = None
    le: int | float | None = None
    lt: int | float | None = None
    also: list[Scalar] = Field(default_factory=list)
    choices: list[Scalar] | None = None
    note: str

    @property
    def rule(self) -> str:
        bounds = " and ".join(f"{op} {v}" for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le),
                                                        ("<", self.lt)) if v is not None)
        if self.choices is not None:
            bounds = " and ".join(filter(None, [bounds, "one of " + ", ".join(map(str, self.choices))]))
        return " or ".join(filter(None, [*map(str, self.also), bounds]))

    def allows(self, value: Any) -> bool:
        if any(_same(value, v) for v in self.also):
            return True
        if self.choices is not None and not any(_same(value, c) for c in self.choices):
            return False
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.choices is not None  # no number to compare: only choices could be checked
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))


def _same(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return a == b if numbers else str(a) == str(b)


class Catalog(BaseModel):
    """The launch flags one engine version accepts (names without the leading ``--``)."""

    model_config = ConfigDict(extra="forbid")

    engine: str
    version: str
    source: str = ""
    allow_abbrev: bool = True
    flags: dict[str, FlagSpec]
    removed: dict[str, RemovedFlag] = Field(default_factory=dict)
    limits: dict[str, FlagLimit] = Field(default_factory=dict)
    planned_for: str | None = Field(default=None, exclude=True)  # the version asked for, where this one is nearest

    @model_validator(mode="after")
    def _limits_name_flags(self) -> Catalog:
        unknown = sorted(set(self.limits) - set(self.flags))
        if unknown:
            raise ValueError(f"limits: {', '.join(unknown)} not among the flags of {self.engine} {self.version}")
        return self

    @property
    def label(self) -> str:
        near = f", the catalogue nearest {self.planned_for}" if self.planned_for not in (None, self.version) else ""
        return f"{self.engine} {self.version}{near}"

    def canonical(self, name: str) -> str:
        """The catalogue's name of a flag given by any spelling (``--x``, ``x``, ``x_y``, an alias)."""
        key = name.strip().lstrip("-").replace("_", "-")
        if key in self.flags:
            return key
        for flag, spec in self.flags.items():
            if key in spec.aliases:
                return flag
        raise FlagError(f"unknown flag --{key} for {self.label}{self._why_unknown(key)}")

    def _why_unknown(self, key: str) -> str:
        gone = self.removed.get(key)
        if gone is not None:
            use = f"; use --{gone.replacement}" if gone.replacement else ""
            return f" (removed in {gone.since}{use})"
        for other in sorted(available_versions(self.engine), key=_version_key, reverse=True):
            if _version_key(other) < _version_key(self.version) and key in load_catalog(self.engine, other).flags:
                return f" (present in {self.engine} {other}, gone by {self.version})"
        return ""

    def coerce(self, name: str, value: FlagValue) -> tuple[str, FlagValue]:
        """``(canonical name, typed value)``; strings from ``--set key=value`` are parsed per the flag's type."""
        flag = self.canonical(name)
        spec = self.flags[flag]
        where = f"--{flag} ({self.label})"
        try:
            typed = _coerce(spec, value)
        except (TypeError, ValueError) as exc:
            raise FlagError(f"bad value {value!r} for {where}: {exc}") from None
        limit = self.limits.get(flag)
        if limit is not None and typed is not None:
            for item in typed if isinstance(typed, list) else [typed]:
                if not limit.allows(_number(spec, item)):
                    shown = value if spec.type == "str" else item  # "128k" as written, a number as typed
                    raise FlagError(f"bad value {shown!r} for {where}: must be {limit.rule} ({limit.note})")
        return flag, typed

    def to_argv(self, args: dict[str, FlagValue]) -> list[str]:
        """argv for already-coerced ``args`` (None and False leave a flag out)."""
        out: list[str] = []
        for flag, value in args.items():
            spec = self.flags.get(flag) or self.flags[self.canonical(flag)]  # another version's name: an alias here
            if value is None:
                continue
            if spec.type in ("bool", "const"):
                if value:
                    out.append(f"--{flag}")
            elif spec.type == "bool_optional":
                out.append(f"--{flag}" if value else f"--no-{flag}")
            elif spec.type == "list":
                out.append(f"--{flag}")
                out.extend(str(v) for v in value)  # type: ignore[union-attr]
            elif spec.type == "json":
                out += [f"--{flag}", value if isinstance(value, str) else json.dumps(value)]
            else:
                out += [f"--{flag}", str(value)]
        return out


def command_text(flags: dict[str, FlagValue | None]) -> str:
    """Flags as a user types them, without a catalogue: ``True`` is a bare switch, ``False``/``None`` left out
    (a store-true flag must never read ``--disable-cuda-graph True``)."""
    words: list[str] = []
    for flag, value in flags.items():
        name = "--" + flag.lstrip("-")
        if value is None or value is False:
            continue
        words.append(name if value is True else f"{name} {value}")
    return " ".join(words)


def _coerce(spec: FlagSpec, value: FlagValue) -> FlagValue:
    if value is None:
        return None
    if spec.type in ("bool", "bool_optional", "const"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("expected true/false")
    if spec.type == "int":
        return _int(value)
    if spec.type == "float":
        if isinstance(value, bool):
            raise ValueError("expected a number")
        return float(value)
    if spec.type == "choice":
        choices = spec.choices or []
        for choice in choices:
            if str(choice) == str(value):
                return choice
        raise ValueError(f"expected one of {', '.join(map(str, choices))}")
    if spec.type == "list":
        items = value if isinstance(value, list) else str(value).replace(",", " ").split()
        cast = {"int": _int, "float": float}.get(spec.item_type or "str", str)
        return [cast(v) for v in items]
    if spec.type == "json":
        if isinstance(value, str):
            json.loads(value)  # raises ValueError naming the position
            return value
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        raise ValueError("expected a single value")
    if spec.parser == "human_readable_int" and not isinstance(value, bool):
        _human_int(str(value))  # the runner's parser would refuse it: say so now
    return str(value)


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer") from None


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_MULTIPLIER = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _human_int(text: str) -> int:
    """SGLang's ``human_readable_int``: ``128k`` = 128000, ``1Ki`` = 1024 (decimals with SI suffixes only)."""
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    m = _HUMAN_INT.fullmatch(text.removeprefix("-"))
    if m is None or ("." in m[1] and (m[2] or "i").endswith("i")) or (sign < 0 and m[2]):
        raise ValueError("expected an integer, plain or with a suffix (1k, 1M; 1Ki, 1Mi)")
    return sign * int(float(m[1]) * _MULTIPLIER.get(m[2] or "", 1))


def _number(spec: FlagSpec, value: Any) -> Any:
    """The number a value stands for where SGLang parses it from text (else the value itself)."""
    if isinstance(value, str) and spec.parser == "human_readable_int":
        return _human_int(value)
    return value


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def catalog_file(directory: Path, engine: str, version: str) -> Path:
    """``<engine>-<version>.yaml`` in ``directory``: a version from a plan or a runner is a label, never a path."""
    return directory / f"{safe_component(f'{engine}-{version}')}.yaml"


def available_versions(engine: str) -> list[str]:
    """Catalogued versions of ``engine``, oldest first."""
    found = [p.stem.removeprefix(f"{engine}-") for p in CATALOG_DIR.glob(f"{engine}-*.yaml")]
    return sorted(found, key=_version_key)


@lru_cache(maxsize=16)
def load_catalog(engine: str, version: str) -> Catalog:
    path = catalog_file(CATALOG_DIR, engine, version)
    if not path.is_file():
        known = ", ".join(available_versions(engine)) or "none"
        raise FlagError(f"no flag catalogue for {engine} {version} (catalogued: {known}); "
                        f"generate one with `python -m servetune.engines.catalog --python PY_WITH_{engine.upper()}`")
    return Catalog.model_validate(safe_load(path.read_text()))


def nearest_version(engine: str, version: str | None) -> str:
    """The shipped catalogue for ``version``: itself, else the newest older one, else the oldest newer one
    (None: the newest). Flags rarely change between patch releases; the runner's own parser then decides."""
    known = available_versions(engine)
    if not known:
        raise FlagError(f"no flag catalogue for {engine} ships with servetune")
    if version is None or version in known:
        return version or known[-1]
    older = [v for v in known if _version_key(v) < _version_key(version)]
    return older[-1] if older else known[0]


def catalog_for(engine: str, version: str | None) -> Catalog:
    """The best catalogue for a planned or detected version: the one read from a runner of exactly that
    version (cached), else the shipped one nearest to it."""
    if version is not None:
        cached = catalog_file(runner_catalog_dir(), engine, version)
        if (CATALOG_DIR / cached.name).is_file():
            return load_catalog(engine, version)
        if cached.is_file():
            return _load_cached(cached, cached.stat().st_mtime_ns)
    near = load_catalog(engine, nearest_version(engine, version))
    return near if version is None else near.model_copy(update={"planned_for": version})


@lru_cache(maxsize=8)
def _load_cached(path: Path, mtime_ns: int) -> Catalog:
    return Catalog.model_validate(safe_load(path.read_text()))


def cache_runner_catalog(dump: dict[str, Any]) -> Path | None:
    """Keep the catalogue a runner's engine printed about itself, so later argv use that version's flags.

    The shipped catalogue of the same version (with its hand-kept facts) always wins; None when one ships
    or the cache cannot be written (a read-only home changes nothing but this cache).
    """
    if catalog_file(CATALOG_DIR, dump['engine'], dump['version']).is_file():
        return None
    directory = runner_catalog_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return write_catalog(catalog_from_probe(dump, *hand_kept(dump["engine"], dump["version"])), directory)
    except (OSError, ValueError, KeyError):  # a flag kind this servetune does not know: the shipped one serves
        return None


def hand_kept(engine: str, version: str, directory: Path = CATALOG_DIR) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``removed`` and ``limits`` facts a new catalogue of ``version`` inherits: those of the existing one
    of that version in ``directory``, else the nearest shipped one's (removals only up to ``version``)."""
    existing = catalog_file(directory, engine, version)
    if existing.is_file():
        data = safe_load(existing.read_text()) or {}
        return data.get("removed") or {}, data.get("limits") or {}
    near = load_catalog(engine, nearest_version(engine, version))
    removed = {k: v.model_dump(mode="json", exclude_none=True) for k, v in near.removed.items()
               if _version_key(v.since) <= _version_key(version)}
    return removed, {k: v.model_dump(mode="json", exclude_defaults=True) for k, v in near.limits.items()}


def catalog_from_probe(dump: dict[str, Any], removed: dict[str, Any] | None = None,
                       limits: dict[str, Any] | None = None) -> Catalog:
    """A catalogue from ``sglang_probe.py dump`` output, the hand-kept ``removed`` and ``limits`` carried over
    (a limit follows its flag through an alias; one on a flag this version lacks is dropped)."""
    flags = {k: FlagSpec.model_validate(v) for k, v in sorted(dump["flags"].items())}
    by_alias = {a: k for k, spec in flags.items() for a in spec.aliases}
    kept = {by_alias.get(k, k): FlagLimit.model_validate(v) for k, v in (limits or {}).items()}
    return Catalog(
        engine=dump["engine"],
        version=dump["version"],
        source=f"generated from {dump['engine']} {dump['version']}'s own argument parser by sglang_probe.py",
        allow_abbrev=dump.get("allow_abbrev", True),
        flags=flags,
        removed={k: RemovedFlag.model_validate(v) for k, v in (removed or {}).items()},
        limits={k: v for k, v in sorted(kept.items()) if k in flags},
    )


def write_catalog(catalog: Catalog, directory: Path = CATALOG_DIR) -> Path:
    path = catalog_file(directory, catalog.engine, catalog.version)
    data = catalog.model_dump(mode="json", exclude_defaults=True)
    data["flags"] = {k: v.model_dump(mode="json", exclude_defaults=True) for k, v in catalog.flags.items()}
    data.pop("removed", None), data.pop("limits", None)  # the hand-kept sections last, in this order
    data["removed"] = {k: v.model_dump(mode="json", exclude_none=True) for k, v in catalog.removed.items()}
    data["limits"] = {k: v.model_dump(mode="json", exclude_defaults=True) for k, v in catalog.limits.items()}
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True))
    return path
