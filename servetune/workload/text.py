"""Building prompt text to a requested token length.

With a tokenizer, each piece is fitted in its context (the prompt text before it), so the
concatenated prompt measures exactly the requested length. Without one, the convention shared
with the simulated engine holds: one whitespace-separated word per token.
"""

from __future__ import annotations

import numpy as np

from servetune.workload.tokenizer import Tokenizer
from servetune.workload.vocab import WORDS

_ADJUST_ROUNDS = 24  # measure-and-correct rounds after the cost-table estimate


class LengthMiss(RuntimeError):
    """The tokenizer would not let a prompt reach its length within tolerance."""


class TextBuilder:
    """Fills pieces of prompt text with seeded vocabulary words to an exact length."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer = tokenizer
        self._words = np.asarray(WORDS, dtype=object)
        if tokenizer is not None:
            # token cost of " word" mid-text: additive under byte-level and metaspace tokenizers;
            # the final measurement corrects any context effects
            self._cost = np.asarray(tokenizer.count_batch([" " + w for w in WORDS]), dtype=np.int64)
            single = np.flatnonzero(self._cost == 1)
            self._cheapest = single if single.size else np.flatnonzero(self._cost == self._cost.min())
        else:
            self._cost = np.ones(len(WORDS), dtype=np.int64)
            self._cheapest = np.arange(len(WORDS))
        self._context_counts: dict[str, int] = {}

    def words(self, rng: np.random.Generator, n: int) -> list[str]:
        return list(self._words[rng.integers(0, len(WORDS), size=n)]) if n > 0 else []

    def count(self, text: str) -> int:
        """Tokens with a tokenizer, whitespace words without one (the simulator's convention)."""
        return self.tokenizer.count(text) if self.tokenizer is not None else len(text.split())

    def count_context(self, context: str) -> int:
        """``count`` memoised for the contexts that repeat (system prompts)."""
        if context not in self._context_counts:
            if len(self._context_counts) > 256:
                self._context_counts.clear()
            self._context_counts[context] = self.count(context)
        return self._context_counts[context]

    def piece(
        self, rng: np.random.Generator, tokens: int, *, lead: str = "", context: str = ""
    ) -> tuple[str, int]:
        """Text starting with ``lead`` such that ``context + text`` grows by ``tokens`` tokens.

        Returns the text and the measured length of ``context + text``. ``context`` is the
        prompt text before this piece (separator included). A piece is never shorter than
        ``lead`` plus one word, so a too-small ``tokens`` yields a longer measured length.
        """
        return self.finish(rng, self.draft(rng, tokens, lead=lead, context=context))

    def draft(self, rng: np.random.Generator, tokens: int, *, lead: str = "", context: str = "") -> Draft:
        """First guess from the per-word cost table; ``finish`` measures and corrects it.

        Split in two so many drafts can be measured in one ``encode_batch`` (all cores).
        """
        base = self.count_context(context) if context else 0
        if self.tokenizer is None:
            n = max(tokens - len(lead.split()), 1)
            return Draft(
                context, lead, [int(i) for i in rng.integers(0, len(WORDS), size=n)], base + tokens, base
            )
        need = tokens - (self.tokenizer.count(lead) if lead else 0)
        idx: list[int] = []
        acc = 0
        # draw words while they fit, then finish with the cheapest ones
        while True:
            batch = rng.integers(0, len(WORDS), size=max(need // 2, 8))
            stop = False
            for i in batch:
                c = int(self._cost[i])
                if acc + c > need - 1:
                    stop = True
                    break
                idx.append(int(i))
                acc += c
            if stop:
                break
        while acc < need or not idx:
            idx.append(int(self._cheapest[rng.integers(0, self._cheapest.size)]))
            acc += int(self._cost[idx[-1]])
        return Draft(context, lead, idx, base + tokens, base)

    def finish(self, rng: np.random.Generator, d: Draft, measured: int | None = None) -> tuple[str, int]:
        """Measure ``d`` (or take ``measured``, the count of ``d.full()``) and correct it:
        drop words while over, add cheapest words while under. Returns (text, measured length)."""
        if self.tokenizer is None:
            text = d.text()
            return text, d.base + len(text.split())
        tok = self.tokenizer
        best: tuple[str, int] | None = None
        for _ in range(_ADJUST_ROUNDS):
            text = d.text()
            got = measured if measured is not None else tok.count(d.context + text)
            measured = None
            err = got - d.target
            if best is None or abs(err) < abs(best[1] - d.target):
                best = (text, got)
            if err == 0:
                break
            if err > 0 and len(d.idx) > 1:
                # drop enough words to land at or under target, one word at least
                drop, freed = 0, 0
                while freed < err and drop < len(d.idx) - 1:
                    drop += 1
                    freed += int(self._cost[d.idx[-drop]])
                del d.idx[len(d.idx) - drop :]
            elif err < 0:
                d.idx.extend(int(self._cheapest[j]) for j in rng.integers(0, self._cheapest.size, size=-err))
            else:
                break
        assert best is not None
        return best


class Draft:
    """A piece of text being fitted: its context, lead, word indices and target length."""

    __slots__ = ("base", "context", "idx", "lead", "target")

    def __init__(self, context: str, lead: str, idx: list[int], target: int, base: int):
        self.context, self.lead, self.idx, self.target, self.base = context, lead, idx, target, base

    def text(self) -> str:
        body = " ".join(WORDS[i] for i in self.idx)
        return f"{self.lead} {body}" if self.lead else body

    def full(self) -> str:
        return self.context + self.text()
