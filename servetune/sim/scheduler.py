"""The engine core: SGLang's scheduler as a discrete-event model, independent of any clock.

A driver (real-time HTTP server or virtual-time ``simulate``) adds requests and asks for the
next iteration at time ``now``; the scheduler forms a batch the way SGLang 0.5.x does, prices it
with the cost model, commits its effects and returns when it ends and who got tokens. The
driver then waits (really or virtually) until ``end`` and releases those tokens.

Modelled after SGLang 0.5.x (docs/sim.md): continuous batching bounded by max_running_requests;
admission by the PrefillAdder (running requests reserve ``min(max_new - generated, 4096) x
new_token_ratio``, a new one needs ``extend + min(max_new, 4096)`` of free + evictable tokens,
budgets ``max_prefill_tokens`` and ``chunked_prefill_size``, at most one chunked request); a
prefill batch replaces that iteration's decode; the radix cache shares prefixes and evicts LRU
unlocked leaves; when a decode step finds the pool full, requests are retracted (fewest outputs,
then longest inputs, first) and new_token_ratio is re-estimated.
"""

from __future__ import annotations

from collections import deque

from .args import CLIP_MAX_NEW_TOKENS, RETRACT_DECODE_STEPS, SimArgs
from .cost import CostModel
from .radix import RadixCache
from .requests import Iteration, RequestRejected, SimRequest, Stats

LPM_FALLBACK_QUEUE = 128  # SGLang falls back from lpm to fcfs above this queue length


class Scheduler:
    def __init__(self, args: SimArgs, cost: CostModel | None = None):
        self.args = args
        self.cost = cost or CostModel.from_args(args)
        self.pool = args.max_total_num_tokens
        self.tree = RadixCache()
        self.radix = not args.disable_radix_cache
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.new_token_ratio = args.init_new_token_ratio
        self.stats = Stats()
        self.clock_end = 0.0  # end of the last iteration
        self.last_decode_rate = 0.0  # tokens/s of the last decode step (gen_throughput)
        self._own = 0  # slots held outside the tree by all requests (kept incrementally)
        # decode bookkeeping is O(1) per step: a running request gets a token at every decode step,
        # so its output count and token times follow from the step counter and ``decode_ends``
        self.steps = 0
        self.decode_ends: list[float] = []  # end time of decode step ``_ends_offset + i``
        self._ends_offset = 0
        self.sum_ctx = 0  # sum over running of prompt + output tokens
        self.finish_at: dict[int, list[SimRequest]] = {}
        self._rem_sum = 0  # sum over running of max_new - out_base + step_base
        self._clipped = 0  # running requests whose remaining tokens exceed CLIP_MAX_NEW_TOKENS

    # --- accounting -----------------------------------------------------------------------

    @property
    def own_total(self) -> int:
        return self._own

    @property
    def free(self) -> int:
        return self.pool - self.tree.total_size - self.own_total

    def used_tokens(self) -> int:
        """Slots held by requests (SGLang's num_used_tokens: pool minus free and evictable)."""
        return self.pool - self.free - self.tree.evictable_size

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and self.chunked is None

    def num_queue(self) -> int:
        return len(self.waiting) + (1 if self.chunked is not None else 0)

    def _alloc(self, n: int) -> bool:
        free = self.free
        if free < n:
            freed = self.tree.evict(n - free)
            self.stats.evicted_tokens += freed
            free += freed
        return free >= n

    # --- requests in --------------------------------------------------------------------

    def add(self, req: SimRequest, now: float) -> None:
        """Queue ``req`` at ``now`` (its queue time starts here); RequestRejected as ``validate``."""
        self.validate(req)
        req.arrival = now
        req.plen = len(req.tokens)
        req.fill = list(req.tokens)
        self.waiting.append(req)

    def validate(self, req: SimRequest) -> None:
        """RequestRejected for what SGLang refuses before scheduling (checked when the request is sent)."""
        ctx = self.args.context_length
        if req.prompt_len + req.max_new > ctx:
            raise RequestRejected(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {req.prompt_len + req.max_new} tokens: {req.prompt_len} tokens "
                f"from the input messages and {req.max_new} tokens for the completion."
            )
        if req.prompt_len >= self.pool:
            raise RequestRejected(
                f"input is longer than the KV cache pool ({req.prompt_len} >= max_total_num_tokens {self.pool})"
            )
        if req.max_new < 1:
            raise RequestRejected("max_new_tokens must be at least 1")

    def abort(self, r: SimRequest) -> None:
        """A client went away: drop the request wherever it is (SGLang aborts it too)."""
        if r.finished_at is not None:
            return
        if r in self.waiting:
            self.waiting.remove(r)
            return
        if r.finish_step >= 0 and r in self.running:
            self.running.remove(r)
            self.finish_at[r.finish_step].remove(r)
            self._leave(r)
            self._finish(r, self.clock_end)
            self.stats.requests_finished -= 1
        # a request in the middle of a chunked prefill finishes that prefill first, then is dropped

    def flush_cache(self) -> bool:
        """``/flush_cache``: only when idle, as SGLang (it refuses while requests are in flight)."""
        if not self.idle:
            return False
        self.tree.reset()
        return True

    # --- one iteration -------------------------------------------------------------------

    def next_iteration(self, now: float) -> Iteration | None:
        """Form, price and commit the next batch starting at ``now``; None when there is nothing to run."""
        if self.idle:
            self.new_token_ratio = self.args.init_new_token_ratio  # SGLang resets it when idle
            self._ends_offset = self.steps  # no running request refers to older steps
            self.decode_ends.clear()
            return None
        it = self._prefill(now)
        if it is None:
            it = self._decode(now)
        if it is not None:
            self.stats.iterations += 1
            self.stats.busy_s += it.end - it.start
            self.clock_end = it.end
        return it

    def _order_waiting(self) -> list[SimRequest]:
        if self.args.schedule_policy == "lpm" and self.radix and len(self.waiting) <= LPM_FALLBACK_QUEUE:
            scored = []
            for i, r in enumerate(self.waiting):
                _, n = self.tree.match_prefix(r.fill)
                scored.append((-n, i, r))
            scored.sort(key=lambda x: (x[0], x[1]))
            return [r for _, _, r in scored]
        return list(self.waiting)

    def _prefill(self, now: float) -> Iteration | None:
        a = self.args
        if self.chunked is None and (not self.waiting or len(self.running) >= a.max_running_requests):
            return None
        reserved = self.new_token_ratio * self._remaining_new()
        rem_total = self.free + self.tree.evictable_size - reserved
        rem_input = a.max_prefill_tokens
        rem_chunk = a.chunked_prefill_size if a.chunking else None
        items: list[tuple[SimRequest, int, int]] = []  # (req, prefix_len, take)
        chunk_next: SimRequest | None = None

        if self.chunked is not None:
            r = self.chunked
            remaining = len(r.fill) - r.done_len
            take = remaining
            if rem_chunk is not None:
                take = min(take, rem_chunk, max(int(rem_total), 1))
            items.append((r, r.done_len, take))
            if take < remaining:
                chunk_next = r
            rem_total -= take
            rem_input -= take
            if rem_chunk is not None:
                rem_chunk -= take

        if chunk_next is None:
            admitted = 0
            for r in self._order_waiting():
                if len(self.running) + admitted + (1 if self.chunked else 0) >= a.max_running_requests:
                    break
                if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                    break
                if self.radix:
                    node, prefix = self.tree.match_prefix(r.fill)
                    if prefix >= len(r.fill):  # always extend at least one token, as SGLang does
                        node, prefix = self.tree.match_prefix(r.fill[:-1])
                else:
                    node, prefix = self.tree.root, 0
                extend = len(r.fill) - prefix
                reserve = min(r.max_new - r.output_len, CLIP_MAX_NEW_TOKENS)
                nothing_else = not self.running and not items
                if extend + reserve >= rem_total and not (nothing_else and extend <= self.pool):
                    break  # NO_TOKEN: wait for memory (a lone request is let in on its input alone)
                if extend > rem_input and items:
                    break
                take = extend
                if rem_chunk is not None and extend > rem_chunk:
                    take = rem_chunk
                    chunk_next = r
                if self.radix and node is not self.tree.root:
                    self.tree.inc_lock(node)
                r.node = node if self.radix else None
                r.done_len = prefix
                if r.cached_tokens is None:
                    r.cached_tokens = prefix
                    r.first_scheduled = now
                self.waiting.remove(r)
                items.append((r, prefix, take))
                admitted += 1
                rem_total -= extend + reserve
                rem_input -= take
                if rem_chunk is not None:
                    rem_chunk -= take
                if chunk_next is not None:
                    break
        if not items:
            return None

        # price the batch
        new_tokens = pairs = ctx_read = vision = images = admitted_images = cached = 0
        for r, prefix, take in items:
            admitted_images += 0 if r.admitted else len(r.images)
            start = r.done_len
            new_tokens += take
            pairs += take * (start + (take + 1) / 2)
            ctx_read += start
            for s, n in r.images:  # SGLang encodes every uncached image the chunk overlaps (again, if split)
                if s < start + take and s + n > start and s + n > prefix:
                    vision += n
                    images += 1
            if start == prefix and r.cached_tokens == prefix and not r.admitted:
                cached += prefix
        gpu = self.cost.extend_s(new_tokens, pairs, ctx_read, len(items), vision, images)
        end = now + max(gpu, self.cost.host_s(admitted_images))  # the GPU waits for the host, then runs

        # commit: KV for the extended tokens, cache it, first tokens for completed prefills
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        st = self.stats
        for r, prefix, take in items:
            if r is not self.chunked:  # newly admitted (or re-admitted after a retraction)
                st.prefill_cache_tokens += prefix
            if not r.admitted:
                st.prompt_tokens += r.prompt_len
                st.cached_tokens += prefix
                r.admitted = True
            st.prefill_compute_tokens += take
            self._alloc(take)
            r.own += take
            self._own += take
            r.done_len += take
            if self.radix:
                self._cache_progress(r, r.done_len)
        self.chunked = chunk_next
        total_prompt = sum(len(r.fill) for r, _, _ in items)
        st.last_cache_hit_rate = sum(p for _, p, _ in items) / total_prompt if total_prompt else 0.0
        for r, _, _ in items:
            if r is chunk_next:
                continue
            r.output_len += 1
            r.token_times.append(end)
            st.generation_tokens += 1
            emitted.append(r)
            if r.output_len >= r.max_new:
                self._finish(r, end)
                finished.append(r)
            else:
                self._join(r)
        return Iteration(end - gpu, end, "prefill", emitted, finished, [], len(items), new_tokens, cached)

    def output_len(self, r: SimRequest) -> int:
        """Tokens generated so far (exact for running requests, whose count is implicit)."""
        if r.finish_step >= 0:
            return r.out_base + self.steps - r.step_base
        return r.output_len

    def _remaining_new(self) -> int:
        """Sum over running of min(max_new - generated, 4096), kept in O(1) unless a request is clipped."""
        steps = self.steps
        if self._clipped:
            return sum(
                min(r.max_new - r.out_base - steps + r.step_base, CLIP_MAX_NEW_TOKENS) for r in self.running
            )
        return self._rem_sum - len(self.running) * steps

    def _join(self, r: SimRequest) -> None:
        self._rem_sum += r.max_new - r.output_len + self.steps
        self._clipped += r.max_new - r.output_len > CLIP_MAX_NEW_TOKENS
        r.out_base = r.output_len
        r.step_base = self.steps
        r.finish_step = self.steps + r.max_new - r.output_len - 1
        self.finish_at.setdefault(r.finish_step, []).append(r)
        self.sum_ctx += r.plen + r.output_len
        self.running.append(r)

    def _leave(self, r: SimRequest) -> None:
        """Materialise what the step counter implied: output count, decode slots, token times."""
        n = self.steps - r.step_base
        self._rem_sum -= r.max_new - r.out_base + r.step_base
        self._clipped -= r.max_new - r.out_base > CLIP_MAX_NEW_TOKENS
        r.output_len = r.out_base + n
        r.own += n  # its decode slots (already counted in _own step by step)
        off = self._ends_offset
        r.token_times.extend(self.decode_ends[r.step_base - off : self.steps - off])
        self.sum_ctx -= r.plen + r.output_len
        r.finish_step = -1

    def _cache_progress(self, r: SimRequest, upto: int) -> None:
        """SGLang's cache_unfinished_req: the computed tokens go into the tree; lock moves down."""
        node, _ = self.tree.insert(r.fill, start=r.node, end=upto)
        self._own -= r.own
        r.own = 0  # those slots now belong to the tree (duplicates freed)
        self.tree.move_lock(r.node or self.tree.root, node)
        r.node = node

    def _finish(self, r: SimRequest, t: float) -> None:
        """SGLang's cache_finished_req: prompt and output go into the tree, the lock is released."""
        r.finished_at = t
        if self.radix:
            seq = r.fill + r.output_tokens(len(r.fill) - r.plen, r.output_len - 1)
            self.tree.insert(seq)
            if r.node is not None and r.node is not self.tree.root:
                self.tree.dec_lock(r.node)
        r.node = None
        self._own -= r.own
        r.own = 0
        self.stats.requests_finished += 1

    def _retract(self, need: int) -> list[SimRequest]:
        """SGLang's retract_decode: free requests until the pool can run ~20 more decode steps."""
        order = sorted(self.running, key=lambda r: (self.output_len(r), -r.plen), reverse=True)
        out: list[SimRequest] = []
        first = True
        while first or self.free < len(order) * RETRACT_DECODE_STEPS:
            first = False
            if len(order) <= 1:
                break
            r = order.pop()
            self.running.remove(r)
            self.finish_at[r.finish_step].remove(r)
            self._leave(r)
            self.stats.retracted_requests += 1
            self.stats.retracted_input_tokens += r.prompt_len
            self.stats.retracted_output_tokens += r.output_len
            self._own -= r.own
            r.own = 0
            if r.node is not None and r.node is not self.tree.root:
                self.tree.dec_lock(r.node)
            r.node = None
            r.retractions += 1
            r.fill = r.tokens + r.output_tokens(0, r.output_len)
            r.done_len = 0
            out.append(r)
            self.stats.evicted_tokens += self.tree.evict(len(order) * RETRACT_DECODE_STEPS - self.free)
        self.waiting.extend(out)
        decoded = sum(self.output_len(r) for r in order)
        max_new = sum(r.max_new for r in order)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / (max_new + 1))
        self.stats.last_retracted = len(out)
        return out

    def _decode(self, now: float) -> Iteration | None:
        if not self.running:
            return None
        retracted: list[SimRequest] = []
        if not self._alloc(len(self.running)):
            retracted = self._retract(len(self.running))
            self._alloc(len(self.running))
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - self.args.new_token_ratio_decay, self.args.min_new_token_ratio
            )
        batch = self.running
        n = len(batch)
        dur = self.cost.decode_s(n, self.sum_ctx)
        end = now + dur
        k = self.steps
        self.decode_ends.append(end)
        self.steps = k + 1
        self.sum_ctx += n
        self._own += n
        self.stats.generation_tokens += n
        self.stats.decode_tokens += n
        self.last_decode_rate = n / dur
        finished = self.finish_at.pop(k, [])
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in batch if id(r) not in done]
            for r in finished:
                self._leave(r)
                self._finish(r, end)
        return Iteration(now, end, "decode", batch, finished, retracted, n, 0, 0)
