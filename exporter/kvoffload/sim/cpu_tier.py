"""The CPU tier of vLLM's native OffloadingConnector (CPUOffloadingSpec): chunk slots and their LRU.

It behaves as vLLM's CPU manager does, and also keeps what /metrics cannot show: bytes never
loaded back. The rules it follows are in docs/scenarios.md ("What is modelled")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class _Chunk:
    stored_at: float
    writing: bool = True
    readers: int = 0
    loads: int = 0


class _Lru:
    def __init__(self) -> None:
        self.order: OrderedDict[int, None] = OrderedDict()

    def touch(self, keys: Sequence[int], writing: Callable[[int], bool]) -> None:
        order = self.order
        for k in reversed(keys):  # reversed: a prefix's first chunks end up most recent
            if k in order:
                order.move_to_end(k)

    def insert(self, key: int) -> None:
        self.order[key] = None

    def evict_one(self, pinned: Callable[[int], bool]) -> int | None:
        for k in self.order:
            if not pinned(k):
                del self.order[k]
                return k
        return None

    def remove(self, key: int) -> None:
        self.order.pop(key, None)


class _Arc:
    """Adaptive Replacement Cache, as in vLLM's ARC policy.

    T1 holds chunks seen once, T2 chunks seen again; ghosts B1/B2 steer T1's target size `p`."""

    def __init__(self, capacity: int) -> None:
        self.c = max(1, capacity)
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def touch(self, keys: Sequence[int], writing: Callable[[int], bool]) -> None:
        for k in reversed(keys):
            if k in self.t1:
                del self.t1[k]
                if writing(k):
                    # just prepared to be stored, not touched twice (vLLM's ARC): stays in T1,
                    # most recent
                    self.t1[k] = None
                else:
                    self.t2[k] = None
            elif k in self.t2:
                self.t2.move_to_end(k)

    def insert(self, key: int) -> None:
        if key in self.b1:
            self.p = min(float(self.c), self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None

    def evict_one(self, pinned: Callable[[int], bool]) -> int | None:
        first, second = (
            (self.t1, self.t2)
            if len(self.t1) > self.p or not self.t2
            else (
                self.t2,
                self.t1,
            )
        )
        for lst in (first, second):
            for k in lst:
                if not pinned(k):
                    del lst[k]
                    ghost = self.b1 if lst is self.t1 else self.b2
                    ghost[k] = None
                    while len(ghost) > self.c:
                        ghost.popitem(last=False)
                    return k
        return None

    def remove(self, key: int) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)


@dataclass
class StoreDecision:
    """Outcome of one prepare_store call for a request's candidate chunks."""

    keys: list[int]  # chunks newly allocated (their store job is to be run)
    requested: int  # chunks asked for (observed in kv_offload_cpu_allocation_size)
    skipped: int  # rejected by store_threshold
    failed: bool  # not enough free + evictable slots: nothing stored
    evicted: list[int] = field(default_factory=list)  # chunks evicted to make room (LRU/ARC)


class CpuTier:
    def __init__(
        self,
        num_chunks: int,
        chunk_bytes: int,
        policy: str = "lru",
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
    ) -> None:
        self.num_chunks = num_chunks
        self.chunk_bytes = chunk_bytes  # bytes moved per chunk (all ranks, unpadded)
        if policy == "lru":
            self._policy: _Lru | _Arc = _Lru()
        elif policy == "arc":
            self._policy = _Arc(num_chunks)
        else:
            raise ValueError(f"unknown eviction policy {policy!r}")
        self.store_threshold = store_threshold
        self._tracker: OrderedDict[int, int] = OrderedDict()
        self._max_tracker = max_tracker_size
        self._chunks: dict[int, _Chunk] = {}
        self.num_pinned = 0
        self.num_writing = 0
        # ground truth
        self.stored_chunks = 0
        self.loaded_chunks = 0
        self.evicted_chunks = 0
        self.evicted_never_loaded = 0

    # -- state ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._chunks)

    def _is_pinned(self, key: int) -> bool:
        c = self._chunks[key]
        return c.writing or c.readers > 0

    def usage(self) -> tuple[float, float, float]:
        """(usage, write usage, read usage) as the CPU manager reports them."""
        if self.num_chunks == 0:
            return 0.0, 0.0, 0.0
        usage = self.num_pinned / self.num_chunks
        write = self.num_writing / self.num_chunks
        return usage, write, max(usage - write, 0.0)

    def resident_never_loaded(self) -> int:
        return sum(1 for c in self._chunks.values() if c.loads == 0 and not c.writing)

    # -- lookups -------------------------------------------------------------------------------

    def touch(self, keys: Sequence[int]) -> None:
        self._policy.touch(keys, self._is_writing)

    def _is_writing(self, key: int) -> bool:
        c = self._chunks.get(key)
        return c is not None and c.writing

    def lookup(self, keys: Sequence[int]) -> int:
        """Number of leading keys present with a completed store."""
        n = 0
        chunks = self._chunks
        for k in keys:
            c = chunks.get(k)
            if c is None or c.writing:
                break
            n += 1
        return n

    # -- stores --------------------------------------------------------------------------------

    def prepare_store(self, keys: Sequence[int], now: float) -> StoreDecision:
        candidates = [k for k in dict.fromkeys(keys) if k not in self._chunks]
        skipped = 0
        if self.store_threshold >= 2:
            eligible = []
            for k in candidates:
                count = self._tracker.pop(k, 0) + 1
                if count >= self.store_threshold:
                    eligible.append(k)
                else:
                    skipped += 1
                    self._tracker[k] = count
                    if len(self._tracker) > self._max_tracker:
                        self._tracker.popitem(last=False)
            candidates = eligible
        n = len(candidates)
        if n == 0:
            return StoreDecision([], 0, skipped, False)
        protected = set(keys)

        def unevictable(key: int) -> bool:
            return key in protected or self._is_pinned(key)

        free = self.num_chunks - len(self._chunks)
        own_idle = sum(1 for k in protected if k in self._chunks and not self._is_pinned(k))
        evictable = len(self._chunks) - self.num_pinned - own_idle
        if n > free + evictable:
            return StoreDecision([], n, skipped, True)
        evicted: list[int] = []

        for _ in range(n - free):
            victim = self._policy.evict_one(unevictable)
            if victim is None:  # cannot happen after the check above; keep the tier consistent
                return StoreDecision([], n, skipped, True, evicted)
            evicted.append(victim)
            c = self._chunks.pop(victim)
            self.evicted_chunks += 1
            if c.loads == 0:
                self.evicted_never_loaded += 1
        for k in candidates:
            self._chunks[k] = _Chunk(stored_at=now)
            self._policy.insert(k)
        self.num_pinned += n
        self.num_writing += n
        return StoreDecision(list(candidates), n, skipped, False, evicted)

    def complete_store(self, keys: Sequence[int]) -> None:
        for k in keys:
            c = self._chunks[k]
            c.writing = False
            self.num_writing -= 1
            if c.readers == 0:
                self.num_pinned -= 1
        self.stored_chunks += len(keys)

    # -- loads ---------------------------------------------------------------------------------

    def begin_load(self, keys: Sequence[int]) -> None:
        for k in keys:
            c = self._chunks[k]
            if c.readers == 0 and not c.writing:
                self.num_pinned += 1
            c.readers += 1
            c.loads += 1
        self.loaded_chunks += len(keys)

    def end_load(self, keys: Sequence[int]) -> None:
        for k in keys:
            c = self._chunks[k]
            c.readers -= 1
            if c.readers == 0 and not c.writing:
                self.num_pinned -= 1


class SecondaryTier:
    """A tier below the CPU tier (TieringOffloadingSpec's `fs` or `obj`), LRU over chunk keys.

    It takes every completed CPU store and serves the CPU tier's misses, as vLLM's tiering does.
    Promotion staging is not modelled, so it never fails to allocate (docs/scenarios.md,
    `tiered`)."""

    def __init__(self, tier_type: str, num_chunks: int) -> None:
        self.tier_type = tier_type
        self.num_chunks = num_chunks
        self._order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def lookup(self, keys: Sequence[int]) -> int:
        """Number of leading keys present; the hits become the most recent."""
        n = 0
        for k in keys:
            if k not in self._order:
                break
            self._order.move_to_end(k)
            n += 1
        return n

    def write(self, keys: Sequence[int]) -> int:
        """Cascade chunks in (those already present only touched); returns how many were new."""
        new = 0
        for k in keys:
            if k in self._order:
                self._order.move_to_end(k)
                continue
            if self.num_chunks <= 0:
                break
            while len(self._order) >= self.num_chunks:
                self._order.popitem(last=False)
            self._order[k] = None
            new += 1
        return new
