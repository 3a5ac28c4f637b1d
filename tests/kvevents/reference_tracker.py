"""The stack-distance tracker as it was before the compact layout (dicts of Python ints, a
float Fenwick tree over positions, a heap of mixed hashes): the reference the compact one must
equal, distance for distance, in exact, sampled and budget modes."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from kvoffload.kvevents.stackdist import _SPACE, DistanceHistogram, _mix


class _Fenwick:
    def __init__(self, n: int) -> None:
        self.n = n
        self.tree = [0.0] * (n + 1)

    def add(self, i: int, delta: float) -> None:
        i += 1
        while i <= self.n:
            self.tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> float:
        total = 0.0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


class ReferenceTracker:
    def __init__(
        self,
        sample_rate: float = 1.0,
        sample_budget: int | None = None,
        mix: Callable[[int], int] = _mix,
    ) -> None:
        self.mix = mix
        self.threshold = int(sample_rate * _SPACE)
        self.sampled = sample_rate < 1 or sample_budget is not None
        self.budget = sample_budget
        self.histogram = DistanceHistogram()
        self._last: dict[int, int] = {}
        self._fw = _Fenwick(16)  # small, so compaction happens often
        self._pos = 0
        self._heap: list[tuple[int, int]] = []
        self.accesses = 0

    @property
    def rate(self) -> float:
        return self.threshold / _SPACE

    @property
    def tracked(self) -> int:
        return len(self._last)

    def reset(self) -> None:
        self._last.clear()
        self._heap.clear()
        self._fw = _Fenwick(16)
        self._pos = 0

    def _weight(self, block: int) -> float | None:
        if not self.sampled:
            return 1.0
        return 1.0 / self.rate if self.mix(block) < self.threshold else None

    def access(self, block: int) -> None:
        probed = self.probe(block)
        if probed is not None:
            self.record(*probed)
        self.touch(block)

    def probe(self, block: int) -> tuple[float, float] | None:
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

    def lookup(self, hashes: Sequence[int], ancestors: Sequence[int] = ()) -> None:
        """What EngineEvents._gpu_stored did with the tracker."""
        running = 0.0
        for h in hashes:
            probed = self.probe(h)
            if probed is not None:
                running = max(running, probed[0])
                self.record(running, probed[1])
        for h in reversed(hashes):
            self.touch(h)
        for h in reversed(ancestors):
            self.touch(h)

    def touch(self, block: int) -> None:
        if self._weight(block) is None:
            return
        if self._pos >= self._fw.n:
            self._compact()
        last = self._last.get(block)
        if last is None:
            if self.sampled:
                heapq.heappush(self._heap, (-self.mix(block), block))
        else:
            self._fw.add(last, -1.0)
        self._fw.add(self._pos, 1.0)
        self._last[block] = self._pos
        self._pos += 1
        if self.budget is not None and len(self._last) > self.budget:
            while len(self._last) > self.budget and self._heap:
                neg, dropped = heapq.heappop(self._heap)
                pos = self._last.pop(dropped, None)
                if pos is not None:
                    self._fw.add(pos, -1.0)
                self.threshold = min(self.threshold, -neg)

    def _compact(self) -> None:
        live = sorted(self._last.items(), key=lambda kv: kv[1])
        self._fw = _Fenwick(max(16, 2 * len(live)))
        for new_pos, (block, _old) in enumerate(live):
            self._last[block] = new_pos
            self._fw.add(new_pos, 1.0)
        self._pos = len(live)
