"""LRU stack distances of a block stream (Mattson), exact or spatially sampled (SHARDS).

The native CPU tier stores every newly computed full prompt block and is read only for blocks
the GPU missed, so it behaves like an LRU cache over the stream of GPU-missed blocks. A block's
stack distance is the number of distinct blocks missed since its previous miss: a tier of C
blocks serves it iff distance < C. One pass over the stream gives the hit ratio at every size.

Exact mode keeps one Fenwick tree over access positions (one mark per distinct block, at its
latest access) and compacts positions when they run out; memory grows with distinct blocks.
Sampled mode (SHARDS, Waldspurger et al., FAST '15) tracks only blocks whose hash falls under a
threshold: distances and counts are scaled by 1/rate. With a fixed budget, the threshold drops
whenever more blocks than the budget are tracked, so memory stays bounded however long it runs.
"""

from __future__ import annotations

import heapq
import math

_MASK64 = (1 << 64) - 1
_SPACE = 1 << 24  # SHARDS threshold space


def _mix(h: int) -> int:
    """A 64-bit finaliser (splitmix64): block hashes are not uniformly spread in every bit."""
    z = (h + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) % _SPACE


class _Fenwick:
    __slots__ = ("n", "tree")

    def __init__(self, n: int) -> None:
        self.n = n
        self.tree = [0.0] * (n + 1)

    def add(self, i: int, delta: float) -> None:
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> float:
        """Sum of positions [0, i)."""
        total = 0.0
        tree = self.tree
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


class DistanceHistogram:
    """Weighted counts of stack distances (in blocks), with cold misses apart.

    Exact below 2^16 blocks (a Fenwick tree over every distance), then 64 log-spaced bins per
    doubling (≈1.1% of the size apart) up to 2^48: memory is fixed however long it runs.
    Sizes inside a coarse bin are interpolated linearly.
    """

    EXACT = 1 << 16
    BINS_PER_DOUBLING = 64

    def __init__(self) -> None:
        self._fw = _Fenwick(self.EXACT)
        self._coarse = [0.0] * (32 * self.BINS_PER_DOUBLING)
        self.cold = 0.0  # first access of a block: a miss at every size
        self.total = 0.0
        self.finite_sum = 0.0  # Σ distance × weight over non-cold accesses (histogram _sum)

    def _bin(self, distance: float) -> int:
        index = int(math.log2(distance / self.EXACT) * self.BINS_PER_DOUBLING)
        return min(index, len(self._coarse) - 1)

    def _bin_low(self, index: int) -> float:
        return self.EXACT * 2 ** (index / self.BINS_PER_DOUBLING)

    def add(self, distance: int, weight: float) -> None:
        if distance < self.EXACT:
            self._fw.add(distance, weight)
        else:
            self._coarse[self._bin(distance)] += weight
        self.total += weight
        self.finite_sum += distance * weight

    def add_cold(self, weight: float) -> None:
        self.cold += weight
        self.total += weight

    def hits_below(self, blocks: float) -> float:
        """Accesses a cache of `blocks` blocks would serve (distance < blocks)."""
        c = math.floor(blocks)
        if c <= 0:
            return 0.0
        if c <= self.EXACT:
            return self._fw.prefix(c)
        hits = self._fw.prefix(self.EXACT)
        top = self._bin(c)
        hits += sum(self._coarse[:top])
        low, high = self._bin_low(top), self._bin_low(top + 1)
        return hits + self._coarse[top] * min(1.0, (c - low) / (high - low))


class StackDistanceTracker:
    """Feed block hashes in access order; read hits at any size from `histogram`.

    sample_rate < 1 samples blocks by hash; sample_budget (blocks) lowers the rate to keep at
    most that many blocks tracked. Both None/1.0: exact.
    """

    def __init__(self, sample_rate: float = 1.0, sample_budget: int | None = None) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        self.threshold = int(sample_rate * _SPACE)
        self.sampled = sample_rate < 1 or sample_budget is not None
        self.budget = sample_budget
        self.histogram = DistanceHistogram()
        self._last: dict[int, int] = {}  # block → position of its latest access
        self._fw = _Fenwick(4096)
        self._pos = 0
        self._heap: list[tuple[int, int]] = []  # (-mixed hash, block): largest first
        self.accesses = 0

    @property
    def rate(self) -> float:
        return self.threshold / _SPACE

    @property
    def tracked(self) -> int:
        return len(self._last)

    def reset(self) -> None:
        """The cache was emptied (a restart, AllBlocksCleared): every block is cold again."""
        self._last.clear()
        self._heap.clear()
        self._fw = _Fenwick(4096)
        self._pos = 0

    def access(self, block: int) -> None:
        """A lookup of `block` (its distance is recorded) that also makes it most recent."""
        self.observe(block)
        self.touch(block)

    def _weight(self, block: int) -> float | None:
        if not self.sampled:
            return 1.0
        return 1.0 / self.rate if _mix(block) < self.threshold else None

    def observe(self, block: int) -> None:
        """Record the stack distance of `block` now (a lookup), without moving it."""
        probed = self.probe(block)
        if probed is not None:
            self.record(*probed)

    def probe(self, block: int) -> tuple[float, float] | None:
        """(distance in blocks, weight) of `block` now — inf when cold — or None when the
        block is not sampled. Records nothing."""
        weight = self._weight(block)
        if weight is None:
            return None
        last = self._last.get(block)
        if last is None:
            return math.inf, weight
        return (self._fw.prefix(self._pos) - self._fw.prefix(last + 1)) * weight, weight

    def record(self, distance: float, weight: float) -> None:
        self.accesses += 1
        if distance == math.inf:
            self.histogram.add_cold(weight)
        else:
            self.histogram.add(round(distance), weight)

    def touch(self, block: int) -> None:
        """Make `block` the most recent (a store, a load, or vLLM's touch of a request's
        blocks), without recording anything."""
        if self._weight(block) is None:
            return
        if self._pos >= self._fw.n:
            self._compact()  # before reading positions: compaction renumbers them
        last = self._last.get(block)
        if last is None:
            if self.sampled:
                heapq.heappush(self._heap, (-_mix(block), block))
        else:
            self._fw.add(last, -1.0)
        self._fw.add(self._pos, 1.0)
        self._last[block] = self._pos
        self._pos += 1
        if self.budget is not None and len(self._last) > self.budget:
            self._shrink_to_budget()

    def _shrink_to_budget(self) -> None:
        # Drop the blocks with the largest mixed hash until within budget; the new threshold
        # is the largest dropped value, so exactly the blocks under it stay sampled.
        assert self.budget is not None
        while len(self._last) > self.budget and self._heap:
            neg, block = heapq.heappop(self._heap)
            pos = self._last.pop(block, None)
            if pos is not None:
                self._fw.add(pos, -1.0)
            self.threshold = min(self.threshold, -neg)

    def _compact(self) -> None:
        """Renumber live positions 0..n-1 (in access order) into a tree with room to grow."""
        live = sorted(self._last.items(), key=lambda kv: kv[1])
        self._fw = _Fenwick(max(4096, 2 * len(live)))
        for new_pos, (block, _old) in enumerate(live):
            self._last[block] = new_pos
            self._fw.add(new_pos, 1.0)
        self._pos = len(live)
