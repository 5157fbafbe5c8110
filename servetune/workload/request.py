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
    history_images: list[list[str]] = field(default_factory=list)  # the images each earlier user turn sent
    history_text_before_images: int | None = None  # requested text tokens ahead of the history's first image
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
                             n_images=len(self.all_images), turn=self.turn,
                             session=self.conversation if self.live_history else -1,
                             text_before_images=self.text_before_images(), warmup=warmup)

    @property
    def all_images(self) -> list[str]:
        """Every image the request carries: the history's (a session re-sends its earlier images), then its own."""
        return [u for turn in self.history_images for u in turn] + self.images

    def text_before_images(self) -> int | None:
        """Requested text tokens ahead of the first image, where ``image_position`` puts it: how many of a
        request's cached tokens are text before any can be image (servetune.multimodal splits the hit rate)."""
        if any(self.history_images):
            return 0 if self.image_position == "before_system" else self.history_text_before_images
        if not self.images or self.user_tokens is None:
            return None
        return {"before_system": 0, "after_text": self.input_tokens}.get(
            self.image_position, max(self.input_tokens - self.user_tokens, 0))

    def chat_messages(self) -> list[dict]:
        """OpenAI chat messages; images become ``image_url`` content parts, where ``image_position`` says."""
        msgs: list[dict] = []
        if self.image_position == "before_system":  # every image, the history's too, ahead of the system prompt
            lead = _parts(self.all_images)
            if lead:
                msgs.append({"role": "user", "content": lead})
            if self.system is not None:
                msgs.append({"role": "system", "content": self.system})
            return [*msgs, *self.history, {"role": "user", "content": self.user}]
        if self.system is not None:
            msgs.append({"role": "system", "content": self.system})
        for k, m in enumerate(self.history):  # a session's earlier turns as they were sent, images included
            images = self.history_images[k // 2] if k % 2 == 0 and k // 2 < len(self.history_images) else []
            msgs.append(self._user_message(m["content"], images) if images else m)
        msgs.append(self._user_message(self.user, self.images))
        return msgs

    def _user_message(self, text: str, images: list[str]) -> dict:
        if not images:
            return {"role": "user", "content": text}
        parts = [{"type": "text", "text": text}]
        return {"role": "user", "content": parts + _parts(images) if self.image_position == "after_text"
                else _parts(images) + parts}

    def prompt_text(self) -> str:
        """Flat prompt for /v1/completions and /generate (system prompt first, so prefixes share)."""
        pieces = [self.system] if self.system is not None else []
        pieces.extend(m["content"] for m in self.history)
        pieces.append(self.user)
        return "\n".join(pieces)


def _parts(urls: list[str]) -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": u}} for u in urls]
