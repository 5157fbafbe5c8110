"""SGLang's radix-tree prefix cache, as bookkeeping: which token prefixes hold KV, who locks them.

Edges are compressed token runs; running requests lock the path to their prefix (lock counts
propagate to the root, as in SGLang's ``inc_lock_ref``); only unlocked leaves can be evicted,
least recently used first. Access times are a logical counter so the simulation stays
deterministic. Sizes are kept incrementally: ``evictable_size`` (unlocked) and
``protected_size`` (locked) together are the tokens the tree holds in the KV pool.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class Node:
    __slots__ = ("key", "children", "parent", "lock", "last", "uid", "depth")

    def __init__(self, key: list, parent: Node | None, uid: int):
        self.key = key
        self.depth = (parent.depth if parent is not None else 0) + len(key)  # tokens from the root to its end
        self.children: dict = {}
        self.parent = parent
        self.lock = 0
        self.last = 0
        self.uid = uid


def _common(key: list, tokens: Sequence, i: int, n: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[i:n]`` (C-speed when the edge matches)."""
    k = len(key)
    if i + k <= n and tokens[i : i + k] == key:
        return k
    m = min(k, n - i)
    j = 0
    while j < m and key[j] == tokens[i + j]:
        j += 1
    return j


class RadixCache:
    def __init__(self) -> None:
        self._uid = 0
        self.root = self._node([], None)
        self.root.lock = 1  # never evicted
        self._tick = 0
        self.evictable_size = 0
        self.protected_size = 0
        self.leaves: set[Node] = set()  # kept incrementally so eviction need not walk the tree

    def _node(self, key: list, parent: Node | None) -> Node:
        self._uid += 1
        return Node(key, parent, self._uid)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def reset(self) -> None:
        """Drop everything (``/flush_cache``); only valid when nothing is locked."""
        self.__init__()  # type: ignore[misc]

    def _split(self, child: Node, m: int) -> Node:
        """Split ``child``'s edge after ``m`` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = self._node(child.key[:m], parent)  # child's depth (where its edge ends) stays
        upper.lock = child.lock
        upper.last = child.last
        child.key = child.key[m:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    def match_prefix(self, tokens: Sequence) -> tuple[Node, int]:
        """The deepest node whose path is a prefix of ``tokens`` and that path's length."""
        self._tick += 1
        tick = self._tick
        node, i, n = self.root, 0, len(tokens)
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                break
            child.last = tick
            m = _common(child.key, tokens, i, n)
            if m < len(child.key):
                child = self._split(child, m)
                node, i = child, i + m
                break
            node, i = child, i + m
        return node, i

    def insert(self, tokens: Sequence, start: Node | None = None, end: int | None = None) -> tuple[Node, int]:
        """Cache ``tokens[:end]``; returns the last node and how many tokens were new to the tree. ``start`` is
        a node on their path (a chunked request's own, locked, so never evicted): the walk goes on from it
        instead of from the root, whose path a small chunk at a time would otherwise retrace each step."""
        self._tick += 1
        tick = self._tick
        node = start if start is not None else self.root
        up = node
        while up is not self.root:  # the path's access times, as a walk from the root sets them
            up.last = tick
            up = up.parent  # type: ignore[assignment]
        i, n = node.depth, len(tokens) if end is None else end
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                leaf = self._node(list(tokens[i:n]), node)
                leaf.last = tick
                node.children[tokens[i]] = leaf
                self.leaves.add(leaf)
                self.leaves.discard(node)
                added = n - i
                self.evictable_size += added  # new nodes start unlocked
                return leaf, added
            child.last = tick
            m = _common(child.key, tokens, i, n)
            if m < len(child.key):
                child = self._split(child, m)
            node, i = child, i + m
        return node, 0

    def move_lock(self, old: Node, new: Node) -> None:
        """``inc_lock(new)`` then ``dec_lock(old)``: where ``old`` is on ``new``'s path (a request's lock moving
        down as its prefill goes on) only the nodes between them change."""
        node = new
        while node is not old:
            if node is self.root:  # old is not above new: the two walks in full
                self.dec_lock(old)
                return
            if node.lock == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def inc_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock -= 1
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until ``num_tokens`` are freed."""
        if num_tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = [(nd.last, nd.uid, nd) for nd in self.leaves if nd.lock == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, nd = heapq.heappop(heap)
            parent = nd.parent
            assert parent is not None
            del parent.children[nd.key[0]]
            self.leaves.discard(nd)
            freed += len(nd.key)
            self.evictable_size -= len(nd.key)
            if not parent.children and parent is not self.root:
                self.leaves.add(parent)
                if parent.lock == 0:
                    heapq.heappush(heap, (parent.last, parent.uid, parent))
        return freed
