"""Turning a ``WorkloadSpec`` into concrete requests, deterministically.

Request ``i`` depends only on the spec and ``i`` (each request and conversation has its own
seeded stream), so ``build_requests(spec, n, start_index=k)`` continues a workload exactly and
successive trials on one server can use fresh indices instead of re-sending cached prompts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servetune.workload.images import image_data_url
from servetune.workload.lengths import LengthSampler
from servetune.workload.request import WorkloadRequest
from servetune.workload.spec import WorkloadSpec
from servetune.workload.text import Draft, LengthMiss, TextBuilder
from servetune.workload.tokenizer import Tokenizer, load_tokenizer
from servetune.workload.trace import TraceSchedule

GENERATOR_VERSION = 1  # bump when the same spec would yield different text
LENGTH_TOLERANCE = 0.02  # with a tokenizer, prompts measure within 2% of the requested length

# independent random streams, so adding a feature never shifts another feature's draws
_S_REQUEST, _S_REQUEST_TEXT, _S_REQUEST_IMAGES, _S_CONV, _S_CONV_TEXT, _S_PREFIX, _S_IMAGE, _S_THINK = range(8)
_USER, _ASSISTANT = 0, 1
_BATCH = 256  # single-turn prompts measured per encode_batch call


@dataclass
class WorkloadBatch:
    spec: WorkloadSpec
    requests: list[WorkloadRequest]
    lengths_exact: bool  # prompts were measured with the model's tokenizer
    tokenizer_name: str | None
    fingerprint: str  # spec (incl. trace contents) + tokenizer + generator version
    start_index: int = 0

    def describe(self) -> dict[str, Any]:
        """The ``workload`` part of a trial result."""
        return {
            "name": self.spec.name,
            "spec": self.spec.model_dump(mode="json"),
            "fingerprint": self.fingerprint,
            "lengths_exact": self.lengths_exact,
            "tokenizer": self.tokenizer_name,
            "requests": len(self.requests),
            "start_index": self.start_index,
            "generator_version": GENERATOR_VERSION,
        }


def batch_fingerprint(spec: WorkloadSpec, tokenizer: Tokenizer | None) -> str:
    h = hashlib.sha256(f"servetune.workload/{GENERATOR_VERSION}|{spec.fingerprint()}|".encode())
    if tokenizer is not None:
        h.update(tokenizer.sha256.encode())
    return h.hexdigest()[:16]


def build_requests(
    spec: WorkloadSpec,
    n: int,
    tokenizer: Tokenizer | str | Path | None = None,
    *,
    start_index: int = 0,
) -> WorkloadBatch:
    """Requests ``start_index .. start_index+n-1`` of the workload ``spec``.

    ``tokenizer`` (or ``spec.tokenizer``) makes lengths exact in the model's tokens; without
    one, every requested token is one whitespace-separated word (the simulator's convention).
    """
    if n < 0 or start_index < 0:
        raise ValueError(f"n ({n}) and start_index ({start_index}) must be >= 0")
    if tokenizer is None and spec.tokenizer:
        tokenizer = spec.tokenizer
    if isinstance(tokenizer, str | Path):
        tokenizer = load_tokenizer(tokenizer)
    gen = _Generator(spec, tokenizer)
    indices = range(start_index, start_index + n)
    if spec.multi_turn is None and tokenizer is not None:
        requests = [r for k in range(0, n, _BATCH) for r in gen.single_turn_batch(indices[k : k + _BATCH])]
    else:
        requests = [gen.request(i) for i in indices]
    return WorkloadBatch(
        spec=spec,
        requests=requests,
        lengths_exact=tokenizer is not None,
        tokenizer_name=tokenizer.name if tokenizer is not None else None,
        fingerprint=gen.fingerprint,
        start_index=start_index,
    )


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(list(keys))


@dataclass
class _Conversation:
    system: str | None
    group: int
    first_input: int  # requested length of turn 0, system prompt included
    outputs: list[int]
    turn_inputs: list[int]  # new user tokens for turns 1..T-1
    messages: list[dict[str, str]] = field(default_factory=list)  # built lazily: u0, a0, u1, a1, ...
    prompt_tokens: list[int] = field(default_factory=list)  # measured whole prompt of each turn
    images: dict[int, tuple[list[str], int]] = field(default_factory=dict)  # by turn: drawn once, re-sent later


class _Generator:
    def __init__(self, spec: WorkloadSpec, tokenizer: Tokenizer | None):
        self.spec = spec
        self.seed = spec.seed
        self.tok = tokenizer
        self.text = TextBuilder(tokenizer)
        self.inputs = LengthSampler(spec.input, what="input")
        self.outputs = LengthSampler(spec.output, what="output")
        mt = spec.multi_turn
        self.turn_inputs = LengthSampler(mt.turn_input, what="multi_turn.turn_input") if mt else None
        self.fingerprint = batch_fingerprint(spec, tokenizer)
        if spec.trace is not None and mt is not None:
            raise ValueError("workload.trace: a trace replays single requests, not conversations (remove multi_turn)")
        self.trace = TraceSchedule(spec.trace) if spec.trace is not None else None
        sp = spec.shared_prefix
        if sp is not None:
            weights = 1.0 / np.arange(1, sp.num_prefixes + 1, dtype=float) ** sp.zipf_s
            self.prefix_p = weights / weights.sum()
        self._prefixes: dict[int, str] = {}
        self._convs: dict[int, _Conversation] = {}
        self._image_pool: dict[int, str] = {}
        self.image_position = spec.images.position if spec.images else "before_text"

    # --- pieces shared by single- and multi-turn requests
    def nonce(self, index: int) -> str:
        """One whitespace word, unique per request and spec, opening with hashed characters so
        that two requests' user messages share at most a token or two (never words)."""
        h = hashlib.blake2b(f"{self.fingerprint}/{index}".encode(), digest_size=4).hexdigest()
        return f"{h}-{index}:"

    def system_prompt(self, group: int) -> str:
        if group not in self._prefixes:
            sp = self.spec.shared_prefix
            assert sp is not None
            rng = _rng(self.seed, _S_PREFIX, group)
            self._prefixes[group] = self.text.piece(rng, sp.tokens, lead=f"[system-{group}]")[0]
        return self._prefixes[group]

    def pick_prefix(self, rng: np.random.Generator) -> int:
        sp = self.spec.shared_prefix
        if sp is None or rng.random() >= sp.share_ratio:
            return -1
        return int(rng.choice(sp.num_prefixes, p=self.prefix_p))

    def images(self, index: int) -> tuple[list[str], int]:
        """Data URLs for request ``index``: unique per request and spec, or (a ``reuse_ratio`` of them)
        drawn from a pool of ``distinct`` images (rendered once per batch) so the server's image cache can hit;
        and how many of the leading ones came from the pool (the part another request can share)."""
        im = self.spec.images
        if im is None:
            return [], 0
        rng = _rng(self.seed, _S_REQUEST_IMAGES, index)
        if rng.random() >= im.ratio:
            return [], 0
        spec_key = int(self.fingerprint[:8], 16)
        size = (im.width, im.height, im.format)
        urls: list[str] = []
        pooled = 0
        for j in range(im.count):
            if im.distinct and (im.reuse_ratio >= 1 or rng.random() < im.reuse_ratio):
                k = int(rng.integers(im.distinct))
                if k not in self._image_pool:
                    self._image_pool[k] = image_data_url((self.seed, _S_IMAGE, 1, spec_key, k), *size)
                urls.append(self._image_pool[k])
                pooled += pooled == j  # still a run of pooled images from the first
            else:
                urls.append(image_data_url((self.seed, _S_IMAGE, 0, spec_key, index, j), *size))
        return urls, pooled

    def _user_piece(
        self, rng: np.random.Generator, target_total: int, context: str, index: int
    ) -> tuple[str, int]:
        """A user message starting with the nonce so ``context + message`` hits ``target_total``."""
        draft = self._user_draft(rng, target_total, context, index)
        return self._checked(index, target_total, *self.text.finish(rng, draft))

    def _user_draft(self, rng: np.random.Generator, target_total: int, context: str, index: int) -> Draft:
        base = self.text.count_context(context) if context else 0
        return self.text.draft(rng, target_total - base, lead=self.nonce(index), context=context)

    def _checked(self, index: int, target_total: int, user: str, got: int) -> tuple[str, int]:
        """(text, requested length): raised to the shortest possible prompt when the target is
        shorter than the context plus the nonce and one word; a miss beyond 2% is an error."""
        if got > target_total and len(user.split()) <= 2:
            return user, got
        if abs(got - target_total) > LENGTH_TOLERANCE * target_total:
            raise LengthMiss(
                f"request {index}: prompt measures {got} tokens, requested {target_total} "
                f"(tokenizer {self.tok.name if self.tok else None})"
            )
        return user, target_total

    # --- requests
    def _single_turn_plan(self, index: int) -> tuple[int, str | None, int, int, np.random.Generator, Draft]:
        rng = _rng(self.seed, _S_REQUEST, index)
        if self.trace is not None:  # a timed trace: row ``index``'s lengths and system prompt, not the spec's
            row, group = self.trace.row(index), self.trace.prefix_group(index)
            target, output, system = row.input_tokens, row.output_tokens, self._trace_system(group)
        else:
            group = self.pick_prefix(rng)
            target = self.inputs.sample(rng)
            output = self.outputs.sample(rng)
            system = self.system_prompt(group) if group >= 0 else None
        context = system + "\n" if system is not None else ""
        text_rng = _rng(self.seed, _S_REQUEST_TEXT, index)
        return group, system, target, output, text_rng, self._user_draft(text_rng, target, context, index)

    def _single_turn_request(
        self, index: int, measured: int | None = None, plan: tuple | None = None
    ) -> WorkloadRequest:
        group, system, target, output, text_rng, draft = plan or self._single_turn_plan(index)
        user, input_tokens = self._checked(index, target, *self.text.finish(text_rng, draft, measured))
        images, pooled = self.images(index)
        return WorkloadRequest(
            index=index,
            system=system,
            user=user,
            input_tokens=input_tokens,
            output_tokens=output,
            prefix_group=group,
            images=images,
            pooled_images=pooled,
            image_position=self.image_position,
            arrival_s=self.trace.arrival_s(index) if self.trace is not None else None,
            user_tokens=input_tokens - self._system_tokens(group, system),
        )

    def _system_tokens(self, group: int, system: str | None) -> int:
        """Requested tokens of a single-turn request's system prompt (0 without one)."""
        if system is None:
            return 0
        if self.trace is not None:
            return self.spec.trace.prefix_tokens  # type: ignore[union-attr]
        return self.spec.shared_prefix.tokens if self.spec.shared_prefix is not None else 0

    def _trace_system(self, group: int) -> str | None:
        """A trace group's system prompt, ``trace.prefix_tokens`` long (None for group -1)."""
        if group < 0:
            return None
        if group not in self._prefixes:
            assert self.spec.trace is not None
            rng = _rng(self.seed, _S_PREFIX, group)
            self._prefixes[group] = self.text.piece(rng, self.spec.trace.prefix_tokens, lead=f"[system-{group}]")[0]
        return self._prefixes[group]

    def single_turn_batch(self, indices: range) -> list[WorkloadRequest]:
        """The same requests as ``request(i)`` each, with the first measurement of every prompt
        done in one ``encode_batch`` (the tokenizer's threads use every core)."""
        assert self.tok is not None
        plans = [self._single_turn_plan(i) for i in indices]
        counts = self.tok.count_batch([p[-1].full() for p in plans])
        return [self._single_turn_request(i, c, p) for i, c, p in zip(indices, counts, plans, strict=True)]

    def request(self, index: int) -> WorkloadRequest:
        if self.spec.multi_turn is not None:
            return self._turn_request(index)
        return self._single_turn_request(index)

    def _position(self, index: int) -> tuple[int, int]:
        """(conversation, turn) of request ``index``: blocks of ``interleave`` conversations, turn-major."""
        mt = self.spec.multi_turn
        assert mt is not None
        w, t = mt.interleave, mt.turns
        block, r = divmod(index, w * t)
        turn, slot = divmod(r, w)
        return block * w + slot, turn

    def _index_of(self, conv: int, turn: int) -> int:
        mt = self.spec.multi_turn
        assert mt is not None
        w, t = mt.interleave, mt.turns
        block, slot = divmod(conv, w)
        return block * w * t + turn * w + slot

    def _conversation(self, conv: int) -> _Conversation:
        if conv not in self._convs:
            mt = self.spec.multi_turn
            assert mt is not None and self.turn_inputs is not None
            rng = _rng(self.seed, _S_CONV, conv)
            group = self.pick_prefix(rng)
            first = self.inputs.sample(rng)
            outputs = [self.outputs.sample(rng) for _ in range(mt.turns)]
            turn_inputs = [self.turn_inputs.sample(rng) for _ in range(mt.turns - 1)]
            system = self.system_prompt(group) if group >= 0 else None
            self._convs[conv] = _Conversation(system, group, first, outputs, turn_inputs)
        return self._convs[conv]

    def _context(self, c: _Conversation, upto: int) -> str:
        pieces = ([c.system] if c.system is not None else []) + [m["content"] for m in c.messages[:upto]]
        return "\n".join(pieces) + "\n" if pieces else ""

    def _ensure_messages(self, conv: int, c: _Conversation, turn: int) -> None:
        """Build user/assistant messages up to and including turn ``turn``'s user message."""
        while len(c.messages) < 2 * turn + 1:
            k, role = divmod(len(c.messages), 2)
            context = self._context(c, len(c.messages))
            rng = _rng(self.seed, _S_CONV_TEXT, conv, k, role)
            if role == _USER and k == 0:
                text, total = self._user_piece(rng, c.first_input, context, self._index_of(conv, 0))
                c.prompt_tokens.append(total)
            elif role == _USER:
                text, total = self.text.piece(
                    rng, c.turn_inputs[k - 1], lead=self.nonce(self._index_of(conv, k)), context=context
                )
                c.prompt_tokens.append(total)
            else:  # the assistant's answer of turn k, standing in at its requested length
                text, _ = self.text.piece(rng, c.outputs[k], context=context)
            c.messages.append({"role": "user" if role == _USER else "assistant", "content": text})

    def _turn_images(self, conv: int, c: _Conversation, turn: int) -> tuple[list[str], int]:
        """Turn ``turn``'s images, rendered once: every later turn of the session sends them again."""
        if turn not in c.images:
            c.images[turn] = self.images(self._index_of(conv, turn))
        return c.images[turn]

    def _turn_request(self, index: int) -> WorkloadRequest:
        conv, turn = self._position(index)
        c = self._conversation(conv)
        self._ensure_messages(conv, c, turn)
        history = [dict(m) for m in c.messages[: 2 * turn]]
        user = c.messages[2 * turn]["content"]
        mt = self.spec.multi_turn
        assert mt is not None
        images, pooled = self._turn_images(conv, c, turn)
        earlier = [self._turn_images(conv, c, k)[0] for k in range(turn)]  # re-sent with the history
        first = next((k for k, urls in enumerate(earlier) if urls), None)
        before = None
        if first is not None:  # text ahead of the first image: the context before turn `first`'s user text
            own = c.turn_inputs[first - 1] if first else c.first_input - self._system_tokens(c.group, c.system)
            before = c.prompt_tokens[first] - (0 if self.image_position == "after_text" else own)
        think = 0.0
        if mt.mode == "sessions" and turn and mt.think_time_s:
            think = float(_rng(self.seed, _S_THINK, conv, turn).exponential(mt.think_time_s))
        return WorkloadRequest(
            index=index,
            system=c.system,
            user=user,
            input_tokens=c.prompt_tokens[turn],
            output_tokens=c.outputs[turn],
            prefix_group=c.group,
            images=images,
            pooled_images=pooled,
            history=history,
            history_images=earlier if first is not None else [],
            history_text_before_images=before,
            conversation=conv,
            turn=turn,
            image_position=self.image_position,
            live_history=mt.mode == "sessions",
            think_s=think,
            user_tokens=c.turn_inputs[turn - 1] if turn else c.first_input - self._system_tokens(c.group, c.system),
        )
