"""LRU stack distances of a block stream (Mattson), exact or spatially sampled (SHARDS).

The CPU tier acts as an LRU cache over GPU-missed blocks. A tier of C blocks serves a block
whose distance is under C. So one pass gives the hit ratio at every size (docs/sizing.md §3).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterator, Sequence
from itertools import compress

from kvoffload.kvevents.blockindex import _GOLD, _M64, HEADROOM, UPKEEP_PIECE, BlockIndex

_SPACE = 1 << 24  # SHARDS threshold space
_MIN_POSITIONS = 4096
# Upkeep keeps at least this many blocks ready to drop at the budget (a step adds at most
# ~STEP_BLOCKS new blocks; each entry is ~100 B, so not HEADROOM of them).
DROP_HEADROOM = 1 << 13


def _mix(h: int) -> int:
    """A 64-bit finaliser (splitmix64): block hashes are not uniformly spread in every bit."""
    z = (h + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
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

    Exact below EXACT, then log-spaced bins up to 2^48, so memory is fixed; sizes within a bin
    are interpolated linearly.
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
        if not blocks > 0:  # (NaN too: a size from hostile figures)
            return 0.0
        c = math.floor(min(blocks, 2.0**62))  # an infinite size serves every finite distance
        if c <= self.EXACT:
            return self._fw.prefix(c)
        hits = self._fw.prefix(self.EXACT)
        top = self._bin(c)
        hits += sum(self._coarse[:top])
        low, high = self._bin_low(top), self._bin_low(top + 1)
        return hits + self._coarse[top] * min(1.0, (c - low) / (high - low))


class StackDistanceTracker:
    """Feed block hashes in access order; read hits at any size from `histogram`.

    Flat arrays, no Python object per block, keep it at 24-36 B a block (docs/performance.md §5).
    A `sample_rate` under 1 samples by hash; `sample_budget` (blocks) caps the blocks tracked.
    """

    def __init__(self, sample_rate: float = 1.0, sample_budget: int | None = None) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        self.threshold = int(sample_rate * _SPACE)
        self.sampled = sample_rate < 1 or sample_budget is not None
        self.budget = sample_budget
        self.histogram = DistanceHistogram()
        self.accesses = 0
        self._clear()

    def _clear(self) -> None:
        self._index = BlockIndex()
        self._last = array("i")  # id → position of its latest access; -1: a free id
        self._mixed = array("i")  # id → _mix(hash), when sampled; -1: a free id
        # Fenwick tree over positions, 1-based, nodes 1.._pos in use, _limit allocated. Filled as
        # positions are used: a new mark costs O(1), moving one walks only the nodes after it.
        self._tree = array("i", bytes(4 * (_MIN_POSITIONS + 1)))
        self._pos = 0  # the next position
        self._limit = _MIN_POSITIONS  # compact when _pos reaches it (twice the tracked blocks)
        # Sampled with a budget: tracked blocks that go first when over it, as (mixed hash,
        # -hash) ascending — the end is the largest mixed hash, the smallest hash among equal
        # ones. It holds every tracked block whose mixed hash is at least `_drop_floor`.
        self._drop: list[tuple[int, int]] = []
        self._drop_floor = _SPACE + 1

    @property
    def rate(self) -> float:
        return self.threshold / _SPACE

    @property
    def tracked(self) -> int:
        return self._index.count

    def reset(self) -> None:
        """The cache was emptied (a restart, AllBlocksCleared): every block is cold again."""
        self._clear()

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
        """(distance in blocks, weight) of `block` now, inf when cold; None when it is not sampled.

        Records nothing.
        """
        weight = self._weight(block)
        if weight is None:
            return None
        k = self._index.find(block)
        if k < 0:
            return math.inf, weight
        return self._after(self._last[k]) * weight, weight

    def _after(self, last: int) -> int:
        """Tracked blocks accessed after position `last`: prefix(pos) - prefix(last + 1),
        both walks stopping where they meet."""
        tree = self._tree
        i, j, s = self._pos, last + 1, 0
        while i != j:
            if i > j:
                s += tree[i]
                i &= i - 1
            else:
                s -= tree[j]
                j &= j - 1
        return s

    def record(self, distance: float, weight: float) -> None:
        self.accesses += 1
        if distance == math.inf:
            self.histogram.add_cold(weight)
        else:
            self.histogram.add(round(distance), weight)

    def touch(self, block: int) -> None:
        """Make `block` the most recent (a store, a load or a touch), recording nothing."""
        self._touch_all((block,), [], [])

    # Kept whole (#26): index.find and _after as calls made it 3.5% slower (an A/B run).
    def lookup(self, hashes: Sequence[int], ancestors: Sequence[int] = ()) -> None:
        """One request's lookup in an LRU tier, as vLLM's offloading scheduler does it.

        `hashes` are its GPU-missed blocks in order, `ancestors` its GPU-hit prefix, root first.
        Probe, record and touch are written out as one loop because this is the hot path.
        """
        # vLLM loads only the leading run of present blocks: each is recorded at the running
        # maximum distance. Then `hashes`, then `ancestors`, each from the last, become recent.
        index = self._index
        find = index.find
        histogram = self.histogram
        hist_tree, exact = histogram._fw.tree, histogram.EXACT
        sampled = self.sampled
        threshold = self.threshold
        weight = 1.0 / self.rate if sampled and threshold else 1.0  # unused at threshold 0
        last, tree, pos = self._last, self._tree, self._pos
        keys, slots, mask, shift = index.keys, index.slots, index.mask, index.shift
        narrow = index.wide is None
        accesses = 0
        running = 0.0
        ids: list[int] = []
        mixes: list[int] = []
        inf = math.inf
        for h in hashes:
            if sampled:
                mixed = _mix(h)
                mixes.append(mixed)
                if mixed >= threshold:
                    ids.append(-1)
                    continue
            if narrow and 0 <= h <= _M64:  # index.find, written out
                i = ((h * _GOLD) & _M64) >> shift
                k = slots[i]
                while k >= 0 and keys[k] != h:
                    i = (i + 1) & mask
                    k = slots[i]
            else:
                k = find(h)
            ids.append(k)
            accesses += 1
            if k < 0:
                running = inf
            elif running != inf:
                i, j, s = pos, last[k] + 1, 0
                while i != j:
                    if i > j:
                        s += tree[i]
                        i &= i - 1
                    else:
                        s -= tree[j]
                        j &= j - 1
                if sampled:
                    d = s * weight
                    if d > running:
                        running = d
                elif s > running:
                    running = s
            if running == inf:
                histogram.add_cold(weight)
            else:
                d = round(running)
                if d < exact:  # histogram.add, written out
                    i = d + 1
                    while i <= exact:
                        hist_tree[i] += weight
                        i += i & -i
                    histogram.total += weight
                    histogram.finite_sum += d * weight
                else:
                    histogram.add(d, weight)
        self.accesses += accesses
        ids.reverse()
        mixes.reverse()
        self._touch_all([*reversed(hashes), *reversed(ancestors)], ids, mixes)

    # Kept whole (#26): a new block's id found in a helper made it 2.7% slower (an A/B run).
    def _touch_all(self, blocks: Sequence[int], ids: list[int], mixes: list[int]) -> None:
        """touch() each of `blocks` in order.

        `ids[x]`, when x < len(ids), is the id blocks[x] had (-1: absent or unsampled).
        `mixes[x]` is its mixed hash when sampled.
        """
        index = self._index
        find, add = index.find, index.add
        sampled, budget = self.sampled, self.budget
        threshold = self.threshold
        last, mixed_of = self._last, self._mixed
        tree, pos, limit = self._tree, self._pos, self._limit
        known = len(ids)
        mixed = 0
        for x, h in enumerate(blocks):
            if sampled:
                mixed = mixes[x] if x < known else _mix(h)
                if mixed >= threshold:
                    continue
            if pos >= limit:
                self._pos = pos
                self._compact()  # renumbers positions (a new _last), not ids
                tree, pos, limit, last = self._tree, self._pos, self._limit, self._last
            k = ids[x] if x < known else -1
            if k >= 0:
                # Its mark moves: -1 on the nodes above its old position, up to the end.
                q = last[k] + 1
                while q <= pos:
                    tree[q] -= 1
                    q += q & -q
                last[k] = pos
            else:
                keys = index.keys
                if index.wide is None and 0 <= h <= _M64:  # index.find, written out
                    slots, mask = index.slots, index.mask
                    i = ((h * _GOLD) & _M64) >> index.shift
                    k = slots[i]
                    while k >= 0 and keys[k] != h:
                        i = (i + 1) & mask
                        k = slots[i]
                    if k < 0 and not index.free:  # index.add, written out: slot i is free
                        k = len(keys)
                        keys.append(h)
                        slots[i] = k
                        index.count += 1
                        if 2 * index.count > len(slots):
                            index.grow()
                        last.append(-1)
                        if sampled:
                            mixed_of.append(mixed)
                else:
                    k = find(h)
                if k < 0:
                    k = add(h)
                    if k == len(last):
                        last.append(-1)
                        if sampled:
                            mixed_of.append(mixed)
                    elif sampled:
                        mixed_of[k] = mixed
                q = last[k]
                if q >= 0:  # it was tracked after all (a repeated block)
                    q += 1
                    while q <= pos:
                        tree[q] -= 1
                        q += q & -q
                elif sampled and mixed >= self._drop_floor:
                    bisect.insort(self._drop, (mixed, -h))
                last[k] = pos
            # The new mark: node pos + 1 covers (pos + 1 - lowbit, pos + 1], its children and
            # the mark itself.
            pos += 1
            low, child, count = pos & -pos, 1, 1
            while child < low:
                count += tree[pos - child]
                child <<= 1
            tree[pos] = count
            if sampled and budget is not None and index.count > budget:
                self._pos = pos
                self._shrink_to_budget()
                threshold = self.threshold
        self._pos = pos

    def _shrink_to_budget(self) -> None:
        # Drop the blocks with the largest mixed hash (the smallest hash first among equal
        # ones) until within budget; the new threshold is the largest dropped value, so
        # exactly the blocks under it stay sampled.
        assert self.budget is not None
        index, tree, pos = self._index, self._tree, self._pos
        while index.count > self.budget:
            if not self._drop and not self._refill_drop():
                return
            mixed, neg = self._drop.pop()
            k = index.remove(-neg)
            if k >= 0:
                q = self._last[k] + 1
                while q <= pos:
                    tree[q] -= 1
                    q += q & -q
                self._last[k] = -1
                self._mixed[k] = -1
            self.threshold = min(self.threshold, mixed)
            if not self._drop:
                self._drop_floor = _SPACE + 1

    def _refill_drop(self) -> bool:
        """Gather the ~1/64 of tracked blocks at the top of the mixed-hash order, by a scan."""
        mixes = self._mixed
        live = self._index.count
        if not live:
            return False
        want = max(64, live // 64)
        floor = max(0, self.threshold - self.threshold * want // live - 1)
        while True:
            ids = list(compress(range(len(mixes)), map(floor.__le__, mixes)))  # m >= floor
            if len(ids) >= min(want, live) or floor == 0:
                break
            floor //= 2
        if len(ids) > 4 * want:
            floor = sorted(mixes[k] for k in ids)[-want]
            ids = [k for k in ids if mixes[k] >= floor]
        hashes = self._index.hashes(ids)
        self._drop = sorted((mixes[k], -h) for k, h in zip(ids, hashes, strict=True))
        self._drop_floor = floor
        return bool(self._drop)

    def _compact(self) -> None:
        """Renumber the tracked blocks' positions 0..n-1, in access order."""
        for _ in self._compact_steps():
            pass

    def upkeep(self) -> Iterator[None]:
        """The O(n) work the next step could need, done ahead in pieces (UPKEEP_PIECE).

        Why: the event loop keeps turning, and the figures equal those of doing it at once.
        Nothing may access the tracker between the pieces; readers see the old state until the end.
        """
        # The index's growth, the blocks to drop at the budget, the positions' compaction.
        most = None if self.budget is None else self.budget + 1
        yield from self._index.grow_steps(most)
        if self.sampled and self.budget is not None:
            room = self._drop_room()
            if self._index.count + room > self.budget and len(self._drop) < room:
                yield from self._extend_drop_steps()
        if self._pos + HEADROOM > self._limit and self._limit >= 4 * HEADROOM:
            yield from self._compact_steps()

    def _drop_room(self) -> int:
        """Blocks kept ready to drop: DROP_HEADROOM, less for a small budget."""
        assert self.budget is not None
        return min(DROP_HEADROOM, self.budget // 16 + 1)

    def _extend_drop_steps(self) -> Iterator[None]:
        """Add the tracked blocks next below `_drop_floor` (mixed-hash order) to `_drop`.

        At least twice the room or 1/64 of them, scanned in pieces.
        """
        mixes = self._mixed
        live = self._index.count
        if not live or self.threshold <= 0:
            return
        top = min(self._drop_floor, self.threshold + 1)  # blocks at or above are in _drop
        want = max(2 * self._drop_room(), live // 64) - len(self._drop)
        # Mixed hashes of tracked blocks spread evenly below the threshold: a range of this
        # width holds ~1.25 × want of them (a range that just fits, halved when short, as
        # the refill at once does, took half of them half the time, and a sort of them all).
        width = self.threshold * want * 5 // (4 * live) + 1
        floor = max(0, top - width)
        found: list[int] = []
        while True:
            for start in range(0, len(mixes), UPKEEP_PIECE):
                yield
                piece = mixes[start : start + UPKEEP_PIECE]
                picked = compress(range(start, start + len(piece)), map(floor.__le__, piece))
                found.extend(k for k in picked if mixes[k] < top)
            if 2 * len(found) >= min(want, live) or floor == 0:
                break
            width *= 2  # too few: the range below too, twice as wide
            top, floor = floor, max(0, floor - width)
        if len(found) > 4 * want:
            cut = sorted(mixes[k] for k in found)[-want]
            found = [k for k in found if mixes[k] >= cut]
            floor = cut
        hashes = self._index.hashes(found)
        self._drop = sorted((mixes[k], -h) for k, h in zip(found, hashes, strict=True)) + self._drop
        self._drop_floor = floor

    def _compact_steps(self) -> Iterator[None]:
        """_compact in pieces: the new positions in a copy, swapped in at the end."""
        last = self._last
        n = len(last)
        order = array("i", [-1]) * self._pos  # position → id
        for start in range(0, n, UPKEEP_PIECE):
            yield
            for k in range(start, min(start + UPKEEP_PIECE, n)):
                p = last[k]
                if p >= 0:
                    order[p] = k
        new = last[:]
        live = 0
        for start in range(0, len(order), UPKEEP_PIECE):
            yield
            for k in order[start : start + UPKEEP_PIECE]:
                if k >= 0:
                    new[k] = live
                    live += 1
        del order
        self._last = new
        self._set_positions(live)

    def _set_positions(self, live: int) -> None:
        """The tree with positions 0..live-1 all marked, rebuilt in place with room for 2 × live.

        Node i covers (i - lowbit(i), i], so it holds lowbit(i). Nodes past the last position are
        written before they are read.
        """
        self._limit = limit = max(_MIN_POSITIONS, 2 * live)
        tree = self._tree
        if len(tree) > limit + 1:
            del tree[limit + 1 :]
        else:
            tree.frombytes(bytes(4 * (limit + 1 - len(tree))))
        if live:
            tree[1] = 1
        n = 1
        while n < live:
            m = min(n, live - n)
            tree[n + 1 : n + m + 1] = tree[1 : m + 1]
            if m == n:
                tree[2 * n] = 2 * n
            n += m
        self._pos = live

    # -- persistence --------------------------------------------------------------------------
    def copy_state(self) -> tuple[BlockIndex, array[int]]:
        """(a copy of the index, a copy of the positions), taken with C-level copies.

        Enough to list the tracked blocks in access order later (blocks_in_order).
        """
        return self._index.copy(), self._last[:]

    @staticmethod
    def blocks_in_order(index: BlockIndex, last: array[int]) -> Iterator[int]:
        """The tracked blocks, least recently accessed first."""
        order = array("i", [-1]) * (max(last, default=-1) + 1)  # position → id
        for k, p in enumerate(last):
            if p >= 0:
                order[p] = k
        return index.iter_hashes(k for k in order if k >= 0)

    def load_blocks(self, blocks: Sequence[int]) -> None:
        """Track `blocks` (least recent first) as if just accessed in that order.

        Raises ValueError when a block appears twice.
        """
        self._clear()
        index = self._index
        for pos, block in enumerate(blocks):
            if index.find(block) >= 0:
                raise ValueError("a block appears twice")
            index.add(block)
            self._last.append(pos)
            if self.sampled:
                self._mixed.append(_mix(block))
        self._set_positions(len(blocks))

    def nbytes(self) -> int:
        """Bytes of its per-block arrays (their length, without over-allocation)."""
        return (
            self._index.nbytes()
            + len(self._last) * 4
            + len(self._mixed) * 4
            + len(self._tree) * 4
            + len(self._drop) * 100
        )
