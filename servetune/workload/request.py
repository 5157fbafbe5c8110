"""One request of a workload, in an endpoint-neutral form the load generator renders."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from servetune.records import RequestRecord


@dataclass(slots=True)
class WorkloadRequest:
    index: int
    system: str | None  # shared system prompt (None: this request has none)
    user: str  # the user message (for multi-turn: the whole history is in ``history``)
    input_tokens: int  # requested prompt length, system prompt included
    output_tokens: int  # requested max_tokens (with ignore_eos: exact)
    prefix_group: int = -1  # which shared system prompt (-1: none)
    images: list[str] = field(default_factory=list)  # data: URLs (base64 PNG/JPEG)
    pooled_images: int = 0  # how many of the leading images come from the workload's pool of repeated ones
    history: list[dict[str, str]] = field(default_factory=list)  # earlier turns, chat messages
    conversation: int = -1  # the session (multi-turn conversation) it belongs to (-1: none)
    turn: int = 0
    image_position: str = "before_text"  # spec.Images.position
    arrival_s: float | None = None  # a timed trace's arrival offset (seconds), else None
    live_history: bool = False  # a session's turn: sent after the previous answer, which its history carries
    think_s: float = 0.0  # a session's turn: the user's pause between the previous answer and this turn
    user_tokens: int | None = None  # requested tokens of this turn's own user text (the rest is system + history)

    def with_answers(self, answers: Sequence[str]) -> WorkloadRequest:
        """This turn with the session's real answers in place of the stand-ins in its history
        (the history alternates user and assistant messages, one answer per earlier turn)."""
        history = [dict(m) for m in self.history]
        for k, text in enumerate(answers[: len(history) // 2]):
            history[2 * k + 1]["content"] = text
        return replace(self, history=history)

    def new_record(self, warmup: bool) -> RequestRecord:
        """The record of sending this request, with what was asked for (filled in by whoever sends it)."""
        return RequestRecord(request_id=self.index, requested_input_tokens=self.input_tokens,
                             requested_output_tokens=self.output_tokens, prefix_group=self.prefix_group,
                             n_images=len(self.images), turn=self.turn, session=self.conversation if self.live_history else -1,
                             text_before_images=self.text_before_images(), warmup=warmup)

    def text_before_images(self) -> int | None:
        """Requested text tokens ahead of the first image, where ``image_position`` puts it: how many of a
        request's cached tokens are text before any can be image (servetune.multimodal splits the hit rate)."""
        if not self.images or self.user_tokens is None:
            return None
        return {"before_system": 0, "after_text": self.input_tokens}.get(
            self.image_position, max(self.input_tokens - self.user_tokens, 0))

    def chat_messages(self) -> list[dict]:
        """OpenAI chat messages; images become ``image_url`` content parts, where ``image_position`` says."""
        msgs: list[dict] = []
        images: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in self.images]
        if images and self.image_position == "before_system":
            msgs.append({"role": "user", "content": images})
            images = []
        if self.system is not None:
            msgs.append({"role": "system", "content": self.system})
        msgs.extend(self.history)
        if images:
            text = [{"type": "text", "text": self.user}]
            msgs.append({"role": "user", "content": text + images if self.image_position == "after_text"
                         else images + text})
        else:
            msgs.append({"role": "user", "content": self.user})
        return msgs

    def prompt_text(self) -> str:
        """Flat prompt for /v1/completions and /generate (system prompt first, so prefixes share)."""
        pieces = [self.system] if self.system is not None else []
        pieces.extend(m["content"] for m in self.history)
        pieces.append(self.user)
        return "\n".join(pieces)
