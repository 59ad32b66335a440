"""A radix prefix cache over token ids with LRU eviction, like SGLang's.

Nodes hold runs of token ids (numpy slices). A request locks the path to its
node while it runs; unlocked nodes are evictable, leaves first, least recently
used first. Sizes are in tokens: the simulator turns them into KV bytes.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np


class RadixNode:
    __slots__ = ("key", "raw", "children", "parent", "ref", "last_access", "alive")

    def __init__(self, key: np.ndarray, parent: "RadixNode | None") -> None:
        self.key = key  # token ids of the edge into this node
        self.raw = key.tobytes()  # the same as bytes: a whole edge is matched by one comparison
        self.children: dict[int, RadixNode] = {}  # by first token of the child's key
        self.parent = parent
        self.ref = 0  # running requests whose locked path passes through this node
        self.last_access = 0  # logical clock of the last match or insert touching it
        self.alive = True  # False once evicted (stale heap entries check it)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    a, b = a[:m], b[:m]
    if a.tobytes() == b.tobytes():  # the common case (a whole edge matches) without a numpy reduction
        return m
    return int((a != b).argmax())


class RadixCache:
    def __init__(self) -> None:
        self.root = RadixNode(np.zeros(0, dtype=np.int32), None)
        self.root.ref = 1  # the root is never evicted
        self.size = 0  # tokens held in the tree
        self.evictable = 0  # tokens in unlocked nodes (all of them can be freed, leaves first)
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, RadixNode]] = []  # (last_access, tiebreak, candidate leaf)
        self._tiebreak = itertools.count()

    def match_prefix(self, tokens: np.ndarray, limit: int | None = None, block: int = 1) -> tuple[int, RadixNode]:
        """Longest cached prefix of ``tokens[:limit]`` in whole ``block``-token blocks: its length and end node.

        An engine with paged KV (vLLM) shares only full blocks, so a match is cut
        back to a multiple of ``block``; the returned node ends exactly there.
        """
        tokens = tokens[: len(tokens) if limit is None else limit]
        node, pos = self._descend(self.root, 0, tokens, next(self._clock))
        return self._back_to_block(node, pos, pos - pos % block)

    def _descend(self, node: RadixNode, pos: int, tokens: np.ndarray, now: int) -> tuple[RadixNode, int]:
        """Follow ``tokens`` down from ``node`` (at depth ``pos``) as far as the tree holds them, stamping
        ``now`` on every node passed; the node reached and its depth."""
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            n = len(child.key)
            if tokens[pos : pos + n].tobytes() != child.raw:  # not the whole edge: find where they part
                n = _common_prefix(child.key, tokens[pos:])
                if n < len(child.key):
                    child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        return node, pos

    def _back_to_block(self, node: RadixNode, pos: int, target: int) -> tuple[int, RadixNode]:
        """The node at depth ``target`` on the path to ``node`` (at depth ``pos``), splitting an edge if needed."""
        while pos - len(node.key) >= target and pos > target:
            pos -= len(node.key)
            node = node.parent
        if pos > target:
            node = self._split(node, len(node.key) - (pos - target))
        return target, node

    def insert(self, tokens: np.ndarray) -> tuple[int, RadixNode]:
        """Add ``tokens`` to the tree: the number of tokens newly stored, and the node where they end."""
        matched, node = self.match_prefix(tokens)
        return self._add_leaf(tokens, matched, node)

    def extend(self, node: RadixNode, depth: int, tokens: np.ndarray) -> tuple[int, RadixNode]:
        """``insert(tokens)`` for a request whose locked ``node`` already holds ``tokens[:depth]``.

        The same tree, stamps and result as ``insert``, without comparing the
        ``depth`` tokens again: a prompt cached chunk by chunk would otherwise
        walk its whole path once per chunk (most of the simulator's time).
        ``node`` is locked, so it was neither evicted nor cut shorter (a split
        keeps the lower half, which ends where it did).
        """
        now = next(self._clock)
        above = node
        while above is not self.root:  # the stamps ``match_prefix`` would give the path it walks again
            above.last_access = now
            above = above.parent
        end, matched = self._descend(node, depth, tokens, now)
        return self._add_leaf(tokens, matched, end)

    def _add_leaf(self, tokens: np.ndarray, matched: int, node: RadixNode) -> tuple[int, RadixNode]:
        """The rest of ``insert``: ``tokens[matched:]`` as a new leaf under ``node``, where the match ended."""
        if matched == len(tokens):
            return 0, node
        leaf = RadixNode(tokens[matched:], node)
        leaf.last_access = node.last_access if matched else next(self._clock)
        node.children[int(tokens[matched])] = leaf
        added = len(leaf.key)
        self.size += added
        self.evictable += added
        self._push(leaf)
        return added, leaf

    def lock(self, node: RadixNode) -> None:
        self._lock_below(node, None)

    def relock(self, old: RadixNode, new: RadixNode) -> None:
        """``lock(new)`` then ``unlock(old)``, for ``old`` on ``new``'s path (a request's lock moving deeper):
        only the nodes below ``old`` change, since everything from ``old`` up stays locked by it."""
        self._lock_below(new, old)

    def _lock_below(self, node: RadixNode | None, stop: RadixNode | None) -> None:
        """Lock ``node`` and its ancestors up to, not including, ``stop`` (None: up to and with the root)."""
        while node is not stop:
            if node is None:
                raise ValueError("relock: the old node is not on the new node's path")
            if node.ref == 0:
                self.evictable -= len(node.key)
            node.ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        leaf = node
        while node is not None:
            node.ref -= 1
            if node.ref == 0:
                self.evictable += len(node.key)
            node = node.parent
        if leaf.ref == 0 and not leaf.children:
            self._push(leaf)

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` tokens if possible (whole nodes, LRU leaves first); returns tokens freed."""
        freed = 0
        while freed < tokens and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not node.alive or node.ref > 0 or node.children:
                continue
            if stamp != node.last_access:  # touched since it was queued: requeue at its real age
                self._push(node)
                continue
            freed += self._remove_leaf(node)
        return freed

    def _remove_leaf(self, node: RadixNode) -> int:
        parent = node.parent
        del parent.children[int(node.key[0])]
        node.alive = False
        n = len(node.key)
        self.size -= n
        self.evictable -= n
        if parent.ref == 0 and not parent.children:
            self._push(parent)
        return n

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Cut ``child``'s edge after ``n`` tokens; returns the new upper node."""
        upper = RadixNode(child.key[:n], child.parent)
        upper.ref, upper.last_access = child.ref, child.last_access
        upper.children[int(child.key[n])] = child
        child.parent.children[int(child.key[0])] = upper
        child.key, child.parent = child.key[n:], upper
        child.raw = child.key.tobytes()
        return upper

    def _push(self, node: RadixNode) -> None:
        heapq.heappush(self._heap, (node.last_access, next(self._tiebreak), node))
