"""Block hash → dense integer id, in flat arrays instead of a dict.

A dict entry costs ~100 B a block, a hash here 8-16 B plus 4 B a slot (docs/performance.md §5).
Ids are dense and reused, so per-block state lives in parallel arrays indexed by id.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

_M64 = (1 << 64) - 1
_GOLD = 0x9E3779B97F4A7C15  # Fibonacci hashing: the slot is the top bits of hash × 2^64/φ
# (h >> 64) & M64 tells apart every h in [-2^64, 2^128 - 2^64) (negatives all give M64 and
# differ in their low word); the few hashes outside go to a plain dict.
_LOW, _HIGH = -(1 << 64), (1 << 128) - (1 << 64)
_MIN_BITS = 10
# Upkeep (see EngineEvents.upkeep): O(n) work is done ahead of need, between ingestion steps,
# in pieces of UPKEEP_PIECE elements (~10-30 ms of a loaded core), on new arrays swapped in at
# the end, so that readers between pieces see the old, whole state. It starts when a step
# adding up to HEADROOM blocks could need it; a bigger step does it at once, as before.
UPKEEP_PIECE = 1 << 16
HEADROOM = 1 << 16


class BlockIndex:
    __slots__ = ("count", "free", "keys", "mask", "other", "shift", "slots", "wide")

    def __init__(self) -> None:
        self.keys = array("Q")  # id → the hash's low 64 bits
        self.wide: array[int] | None = None  # id → bits 64..127, once any hash needs them
        self.other: dict[int, int] = {}  # hashes outside [_LOW, _HIGH) → id
        # Open addressing: linear probing, at most half full, backward-shift deletion.
        self.slots = array("i", [-1]) * (1 << _MIN_BITS)  # id, or -1 when empty
        self.mask = (1 << _MIN_BITS) - 1
        self.shift = 64 - _MIN_BITS
        self.count = 0  # live ids
        self.free = array("i")  # ids given back, reused first

    def __len__(self) -> int:
        return self.count

    @property
    def capacity(self) -> int:
        """Ids handed out so far (live or free): the length per-id arrays need."""
        return len(self.keys)

    def find(self, h: int) -> int:
        """The id of `h`, or -1."""
        if self.wide is None and 0 <= h <= _M64:
            slots, keys, mask = self.slots, self.keys, self.mask
            i = ((h * _GOLD) & _M64) >> self.shift
            k = slots[i]
            while k >= 0:
                if keys[k] == h:
                    return k
                i = (i + 1) & mask
                k = slots[i]
            return -1
        return self._find_general(h)

    def _find_general(self, h: int) -> int:
        if not _LOW <= h < _HIGH:
            return self.other.get(h, -1)
        lo, hw = h & _M64, (h >> 64) & _M64
        wide = self.wide
        if wide is None:
            if hw:
                return -1  # no stored hash has high bits yet
            wide_check = False
        else:
            wide_check = True
        slots, keys, mask = self.slots, self.keys, self.mask
        i = (((lo ^ hw) * _GOLD) & _M64) >> self.shift
        k = slots[i]
        while k >= 0:
            if keys[k] == lo and (not wide_check or wide[k] == hw):  # type: ignore[index]
                return k
            i = (i + 1) & mask
            k = slots[i]
        return -1

    def _home(self, k: int) -> int:
        hw = self.wide[k] if self.wide is not None else 0
        return (((self.keys[k] ^ hw) * _GOLD) & _M64) >> self.shift

    def add(self, h: int) -> int:
        """A new id for `h`, which must not be present (find(h) == -1)."""
        inside = _LOW <= h < _HIGH
        lo, hw = (h & _M64, (h >> 64) & _M64) if inside else (0, 0)
        if hw and self.wide is None:
            self.wide = array("Q", bytes(8 * len(self.keys)))
        keys, wide = self.keys, self.wide
        if self.free:
            k = self.free.pop()
            keys[k] = lo
            if wide is not None:
                wide[k] = hw
        else:
            k = len(keys)
            keys.append(lo)
            if wide is not None:
                wide.append(hw)
        self.count += 1
        if not inside:
            self.other[h] = k
            return k
        slots, mask = self.slots, self.mask
        i = (((lo ^ hw) * _GOLD) & _M64) >> self.shift
        while slots[i] >= 0:
            i = (i + 1) & mask
        slots[i] = k
        if 2 * self.count > len(slots):
            self.grow()
        return k

    def grow(self) -> None:
        for _ in self._grow_steps():
            pass

    def grow_steps(self, most: int | None = None) -> Iterator[None]:
        """Double the table ahead of need, in pieces, when HEADROOM more adds could need it.

        `most`: the count it never grows past (a budget). Nothing may add or remove between the
        pieces (EngineEvents.upkeep runs them between ingestion steps).
        """
        slots = len(self.slots)
        if 2 * (self.count + HEADROOM) <= slots or slots < 4 * HEADROOM:
            return
        if most is not None and 2 * most <= slots:
            return
        yield from self._grow_steps()

    def _grow_steps(self) -> Iterator[None]:
        old = self.slots
        bits = (len(old) << 1).bit_length() - 1
        slots = array("i", [-1]) * (1 << bits)
        mask = (1 << bits) - 1
        shift = 64 - bits
        keys, wide = self.keys, self.wide
        for at in range(0, len(old), UPKEEP_PIECE):
            if at:
                yield
            for k in old[at : at + UPKEEP_PIECE]:
                if k < 0:
                    continue
                key = keys[k] if wide is None else keys[k] ^ wide[k]
                i = ((key * _GOLD) & _M64) >> shift
                while slots[i] >= 0:
                    i = (i + 1) & mask
                slots[i] = k
        self.slots, self.mask, self.shift = slots, mask, shift

    def remove(self, h: int) -> int:
        """Forget `h`; its id (now free, reused by a later add) or -1 when it was absent."""
        k = self.find(h)
        if k < 0:
            return -1
        self.count -= 1
        self.free.append(k)
        if not _LOW <= h < _HIGH:
            del self.other[h]
            return k
        slots, mask = self.slots, self.mask
        i = self._home(k)
        while slots[i] != k:
            i = (i + 1) & mask
        # Backward shift: pull each later entry of the run into the hole unless its home
        # lies cyclically in (hole, its slot], so every entry stays reachable from its home.
        slots[i] = -1
        j = i
        while True:
            j = (j + 1) & mask
            other = slots[j]
            if other < 0:
                return k
            home = self._home(other)
            if (home <= i or home > j) if i < j else (home <= i and home > j):
                slots[i] = other
                slots[j] = -1
                i = j

    def iter_hashes(self, ids: Iterable[int]) -> Iterator[int]:
        """The hashes of live ids, in the order given."""
        keys, wide = self.keys, self.wide
        rev = {k: h for h, k in self.other.items()}
        for k in ids:
            if rev and k in rev:
                yield rev[k]
                continue
            lo = keys[k]
            hw = wide[k] if wide is not None else 0
            yield lo - (1 << 64) if hw == _M64 else (hw << 64) | lo

    def hashes(self, ids: Iterable[int]) -> list[int]:
        return list(self.iter_hashes(ids))

    def ids(self) -> list[int]:
        """Every live id (table order, then the `other` ones)."""
        return [k for k in self.slots if k >= 0] + list(self.other.values())

    def copy(self) -> BlockIndex:
        """An independent copy (C-level array copies)."""
        new = BlockIndex.__new__(BlockIndex)
        new.keys = self.keys[:]
        new.wide = self.wide[:] if self.wide is not None else None
        new.other = dict(self.other)
        new.slots = self.slots[:]
        new.mask, new.shift, new.count = self.mask, self.shift, self.count
        new.free = self.free[:]
        return new

    def nbytes(self) -> int:
        """Bytes of its arrays (allocated length, without over-allocation)."""
        wide = len(self.wide) * 8 if self.wide is not None else 0
        return len(self.keys) * 8 + wide + len(self.slots) * 4 + len(self.free) * 4


class _Oldest:
    """Ids of a `BlockIndex` in the order added, so the oldest can be forgotten past `limit`.

    `_queue` lists ids oldest first from `_head`, with stale entries; `_at[id]` is the live entry's
    place, -1 when free. The queue is rebuilt when stale entries outnumber live ones: O(1) amortised
    per add, remove and eviction.
    """

    __slots__ = ("_at", "_head", "_index", "_queue", "evicted", "limit")

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.evicted = 0  # entries forgotten to stay within the limit
        self._reset()

    def _reset(self) -> None:
        self._index = BlockIndex()
        self._queue = array("i")
        self._head = 0
        self._at = array("i")

    def __len__(self) -> int:
        return self._index.count

    def __contains__(self, h: int) -> bool:
        return self._index.find(h) >= 0

    def _added(self, k: int) -> None:
        """Id `k` was just added (the newest)."""
        at = self._at
        if k == len(at):
            at.append(len(self._queue))
        else:
            at[k] = len(self._queue)
        self._queue.append(k)
        limit = self.limit
        if limit is not None and self._index.count > limit:
            self._evict_oldest()

    def _removed(self, k: int) -> None:
        self._at[k] = -1
        if len(self._queue) > 2 * self._index.count + 1024:
            self._compact()

    def _evict_oldest(self) -> None:
        queue, at = self._queue, self._at
        head = self._head
        while True:
            k = queue[head]
            head += 1
            if at[k] == head - 1:
                break
        self._head = head
        (h,) = self._index.hashes((k,))
        self._index.remove(h)
        self._forget(k)
        self.evicted += 1
        self._removed(k)

    def _forget(self, k: int) -> None:
        """Clear the per-id data of `k` (removed or evicted)."""

    def _compact(self) -> None:
        for _ in self._compact_steps():
            pass

    def upkeep(self) -> Iterator[None]:
        """The table's growth and the queue's rebuild ahead of need, in pieces (UPKEEP_PIECE).

        Nothing may add or remove between them.
        """
        yield from self._index.grow_steps(None if self.limit is None else self.limit + 1)
        due = 2 * self._index.count + 1024
        if len(self._queue) + HEADROOM > due >= 4 * HEADROOM:
            yield from self._compact_steps()

    def _compact_steps(self) -> Iterator[None]:
        """The queue without its stale entries, built beside the old one and swapped in."""
        queue, old_at = self._queue, self._at
        at = old_at[:]
        new = array("i")
        for start in range(self._head, len(queue), UPKEEP_PIECE):
            if start > self._head:
                yield
            for i in range(start, min(start + UPKEEP_PIECE, len(queue))):
                k = queue[i]
                if old_at[k] == i:
                    at[k] = len(new)
                    new.append(k)
        self._queue, self._head, self._at = new, 0, at

    def _ids_oldest_first(self) -> list[int]:
        queue, at = self._queue, self._at
        return [queue[i] for i in range(self._head, len(queue)) if at[queue[i]] == i]

    def _copy_into(self, new: _Oldest) -> None:
        new.limit, new.evicted = self.limit, self.evicted
        new._index = self._index.copy()
        new._queue, new._head, new._at = self._queue[:], self._head, self._at[:]

    def _nbytes(self) -> int:
        return self._index.nbytes() + 4 * (len(self._queue) + len(self._at))


class ResidentBlocks(_Oldest):
    """The CPU tier's blocks: hash → loaded since stored; past `limit` the oldest go first.

    About 1 B per id beside the index (docs/performance.md).
    """

    __slots__ = ("_state",)

    _ABSENT, _STORED, _LOADED = 0, 1, 2

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)

    def _reset(self) -> None:
        super()._reset()
        self._state = bytearray()  # id → 0 free, 1 stored (not loaded since), 2 loaded

    def store(self, h: int) -> None:
        """Stored (again): not loaded since."""
        k = self._index.find(h)
        if k < 0:
            k = self._index.add(h)
            if k == len(self._state):
                self._state.append(self._STORED)
            else:
                self._state[k] = self._STORED
            self._added(k)
            return
        self._state[k] = self._STORED

    def load(self, h: int) -> bool:
        """Mark `h` loaded back; False when it is not resident."""
        k = self._index.find(h)
        if k < 0:
            return False
        self._state[k] = self._LOADED
        return True

    def pop(self, h: int) -> bool | None:
        """Remove `h`: whether it was loaded since stored, None when it was not resident."""
        k = self._index.remove(h)
        if k < 0:
            return None
        loaded = self._state[k] == self._LOADED
        self._forget(k)
        self._removed(k)
        return loaded

    def _forget(self, k: int) -> None:
        self._state[k] = self._ABSENT

    def never_loaded(self) -> int:
        return self._state.count(self._STORED)

    def items(self) -> list[tuple[int, bool]]:
        """(hash, loaded since stored), the oldest stored first."""
        ids = self._ids_oldest_first()
        state = self._state
        return list(
            zip(self._index.hashes(ids), (state[k] == self._LOADED for k in ids), strict=True)
        )

    def clear(self) -> None:
        self._reset()

    def copy(self) -> ResidentBlocks:
        new = ResidentBlocks.__new__(ResidentBlocks)
        self._copy_into(new)
        new._state = self._state[:]
        return new

    def nbytes(self) -> int:
        return self._nbytes() + len(self._state)
