"""The GPU KV cache with vLLM's prefix caching: a block pool, a free queue, residency samples.

It follows vLLM v1's BlockPool closely enough for the metrics to mean the same.
Those rules are in docs/scenarios.md ("What is modelled": GPU prefix cache)."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# (lifetime_s, idle_before_evict_s, reuse_gaps_s) of a sampled block at its eviction
ResidencyObserver = Callable[[float, float, list[float]], None]


@dataclass
class _Sample:
    """Residency tracking of one sampled block (vLLM keeps the last 4 accesses)."""

    born: float
    last_access: float
    hits: deque[float] = field(default_factory=lambda: deque(maxlen=4))


class GpuPrefixCache:
    def __init__(
        self,
        num_blocks: int,
        sample_rate: float = 0.0,
        rng: random.Random | None = None,
        on_evict_sampled: ResidencyObserver | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("need at least one usable GPU block besides the null block")
        self.num_blocks = num_blocks
        self.usable = num_blocks - 1
        # block ids 1..num_blocks-1 (0 is the null block); front of the queue = evicted first
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of: dict[int, int] = {}
        self._ref: list[int] = [0] * num_blocks
        self.num_referenced = 0
        self._sample_rate = sample_rate
        self._rng = rng or random.Random(0)
        self._on_evict = on_evict_sampled
        self._samples: dict[int, _Sample] = {}
        self.evictions = 0
        # Hashes evicted since the engine last took them, for KV events (BlockRemoved). None
        # when events are off, so the default run keeps no list.
        self.removed: list[int] | None = None

    # -- queries -------------------------------------------------------------------------------

    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: referenced blocks / usable blocks."""
        return self.num_referenced / self.usable

    def hit_blocks(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Length of the cached run of blocks at the start of the prompt."""
        n = 0
        limit = min(max_blocks, len(hashes))
        block_of = self._block_of
        while n < limit and hashes[n] in block_of:
            n += 1
        return n

    def can_allocate(self, hashes: Sequence[int], hit: int, total_blocks: int) -> bool:
        free = len(self._free)
        for h in hashes[:hit]:
            if self._ref[self._block_of[h]] == 0:
                free -= 1  # touching a free cached block takes it out of the free queue
        return total_blocks - hit <= free

    # -- mutations -----------------------------------------------------------------------------

    def allocate(self, hashes: Sequence[int], hit: int, total_blocks: int, now: float) -> list[int]:
        """Reference the `hit` cached blocks and allocate the rest (caller checked capacity)."""
        blocks: list[int] = []
        for h in hashes[:hit]:
            b = self._block_of[h]
            if self._ref[b] == 0:
                del self._free[b]
                self.num_referenced += 1
            self._ref[b] += 1
            s = self._samples.get(b)
            if s is not None:  # a prefix hit is an access; allocation is not
                s.hits.append(now)
                s.last_access = now
            blocks.append(b)
        for _ in range(total_blocks - hit):
            b, _ = self._free.popitem(last=False)
            self._evict(b, now)
            self._ref[b] = 1
            self.num_referenced += 1
            if self._sample_rate > 0 and self._rng.random() < self._sample_rate:
                self._samples[b] = _Sample(born=now, last_access=now)
            blocks.append(b)
        return blocks

    def cache(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        end: int,
        runs: list[tuple[int, int]] | None = None,
    ) -> None:
        """Give blocks[start:end] their hashes once their KV is computed or loaded.

        `runs` gets the [first, last + 1) ranges that really became cached, for BlockStored."""
        # A block whose hash is already resident is skipped and splits the range: one hash maps
        # to one GPU block here (vLLM would keep both copies).
        run_start = -1
        for i in range(start, end):
            h = hashes[i]
            b = blocks[i]
            if h in self._block_of or self._hash_of[b] is not None:
                # a concurrent request computed the same block first (or it is the recomputed
                # last block of a fully cached prompt): keep the resident copy
                if runs is not None and run_start >= 0:
                    runs.append((run_start, i))
                run_start = -1
                continue
            self._hash_of[b] = h
            self._block_of[h] = b
            if run_start < 0:
                run_start = i
        if runs is not None and run_start >= 0:
            runs.append((run_start, end))

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, tail first (the tail is the first to be evicted)."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self.num_referenced -= 1
                self._free[b] = None

    def _evict(self, b: int, now: float) -> None:
        h = self._hash_of[b]
        s = self._samples.pop(b, None)
        if h is None:
            return
        del self._block_of[h]
        self._hash_of[b] = None
        self.evictions += 1
        if self.removed is not None:
            self.removed.append(h)
        if s is not None and self._on_evict is not None:
            hits = list(s.hits)
            gaps = [b2 - a for a, b2 in itertools.pairwise(hits)]
            self._on_evict(now - s.born, now - s.last_access, gaps)
