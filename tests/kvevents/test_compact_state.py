"""The compact event state (flat arrays keyed by a dense id per block hash) against the dict-
based structures it replaced: the same distances, the same histogram, the same sampling
threshold, in exact, sampled and budget modes, on random streams of any hash (64-bit, negative,
128-bit, beyond), through resets and a save/load."""

from __future__ import annotations

import random
from collections import OrderedDict
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_tracker import ReferenceTracker

from kvoffload.kvevents import stackdist
from kvoffload.kvevents.blockindex import BlockIndex, ResidentBlocks
from kvoffload.kvevents.stackdist import StackDistanceTracker

M64 = (1 << 64) - 1
# Hashes that share a low word, sit at the edges of what the arrays hold, or beyond them.
EDGE = [
    0,
    1,
    M64,
    M64 + 1,
    -1,
    -(1 << 63),
    -(1 << 64),
    -(1 << 64) - 1,
    (1 << 63) + 5,
    (1 << 64) + 5,
    5,
    5 - (1 << 64),
    (1 << 127) + 5,
    (1 << 128) - 1,
    (1 << 128) - (1 << 64) + 5,
    (1 << 128) + 5,
    -(1 << 200),
]


def hashes(pool: int = 40) -> st.SearchStrategy[int]:
    """Few distinct values, so blocks come back; most are plain 64-bit hashes."""
    plain = st.integers(0, pool).map(lambda i: (i * 0x9E3779B97F4A7C15 + 7) & M64)
    return st.one_of(plain, plain, plain, st.sampled_from(EDGE), st.integers(0, pool))


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("lookup"),
            st.lists(hashes(), min_size=1, max_size=8),
            st.lists(hashes(), max_size=4),
        ),
        st.tuples(st.just("access"), hashes()),
        st.tuples(st.just("touch"), hashes()),
        st.tuples(st.just("reset")),
        st.tuples(st.just("reload")),
    ),
    max_size=120,
)


_MIX = stackdist._mix


def _coarse_mix(h: int) -> int:
    """Eight mixed-hash values: ties everywhere, to check which of equal ones goes first."""
    return (_MIX(h) >> 21) << 21


def _same(new: StackDistanceTracker, ref: ReferenceTracker) -> None:
    h, r = new.histogram, ref.histogram
    assert h._fw.tree == r._fw.tree
    assert h._coarse == r._coarse
    assert (h.cold, h.total, h.finite_sum) == (r.cold, r.total, r.finite_sum)
    assert new.accesses == ref.accesses
    assert new.threshold == ref.threshold
    assert new.tracked == ref.tracked


def _reloaded(t: StackDistanceTracker) -> StackDistanceTracker:
    """What persist does: the blocks in access order into a fresh tracker."""
    fresh = StackDistanceTracker(1.0 if not t.sampled else 0.5, t.budget)
    fresh.sampled = t.sampled
    fresh.threshold, fresh.accesses, fresh.histogram = t.threshold, t.accesses, t.histogram
    fresh.load_blocks(list(StackDistanceTracker.blocks_in_order(*t.copy_state())))
    return fresh


def _run(ops, rate: float, budget: int | None, mix=stackdist._mix) -> None:
    with mock.patch.object(stackdist, "_mix", mix):
        new = StackDistanceTracker(rate, budget)
        ref = ReferenceTracker(rate, budget, mix)
        lru: list[int] = []  # most recent last: the plain LRU stack, exact mode only

        def moved(blocks) -> None:
            for b in blocks:
                if b in lru:
                    lru.remove(b)
                lru.append(b)

        for op in ops:
            if op[0] == "lookup":
                _, blocks, ancestors = op
                new.lookup(blocks, ancestors)
                ref.lookup(blocks, ancestors)
                moved([*reversed(blocks), *reversed(ancestors)])
            elif op[0] in ("access", "touch"):
                block = op[1]
                if not new.sampled:
                    want = len(lru) - 1 - lru.index(block) if block in lru else None
                    got = new.probe(block)
                    assert got is not None
                    assert got[0] == (float("inf") if want is None else want)
                getattr(new, op[0])(block)
                getattr(ref, op[0])(block)
                moved([block])
            elif op[0] == "reset":
                new.reset()
                ref.reset()
                lru.clear()
            else:
                new = _reloaded(new)
            _same(new, ref)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(OPS)
def test_exact_equals_the_dict_tracker_and_an_lru_stack(ops):
    _run(ops, 1.0, None)


@SETTINGS
@given(OPS)
def test_sampled_equals_the_dict_tracker(ops):
    _run(ops, 0.5, None)


@SETTINGS
@given(OPS, st.integers(1, 12))
def test_budget_equals_the_dict_tracker(ops, budget):
    _run(ops, 1.0, budget)


@SETTINGS
@given(OPS, st.integers(1, 12))
def test_budget_with_equal_mixed_hashes_drops_in_the_same_order(ops, budget):
    _run(ops, 1.0, budget, _coarse_mix)


def test_of_equal_mixed_hashes_the_smallest_hash_goes_first():
    # 1 and 2 share the largest mixed hash; over the budget, 1 goes (as the heap did), and 2
    # stays tracked (no longer sampled: the threshold is now its mixed hash), its mark between
    # 3's accesses.
    top = stackdist._SPACE - 1  # the rate stays ~1: distances keep their size
    mixed = {1: top, 2: top, 3: 5}
    with mock.patch.object(stackdist, "_mix", mixed.__getitem__):
        new = StackDistanceTracker(1.0, 2)
        ref = ReferenceTracker(1.0, 2, mixed.__getitem__)
        for block in (1, 3, 2, 3):
            new.access(block)
            ref.access(block)
            _same(new, ref)
    assert new.threshold == top and new.tracked == 2
    assert new.histogram.hits_below(1) == 0 < new.histogram.hits_below(2)  # 3: distance 1


def _zipf_requests(n: int, docs: int, seed: int):
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 0.8 for i in range(docs)]
    for doc in rng.choices(range(docs), weights=weights, k=n):
        blocks = [(doc * 1_000_003 + j) * 0x9E3779B97F4A7C15 & M64 for j in range(16)]
        cut = rng.randrange(16)  # a GPU-hit prefix, then the missed blocks
        yield blocks[cut:], blocks[:cut]


def test_long_streams_equal_the_dict_tracker_through_compactions_and_drops():
    # Thousands of distinct blocks: many compactions, table growths and budget refills.
    for rate, budget in ((1.0, None), (1.0, 700), (0.3, None), (0.5, 2_000)):
        new, ref = StackDistanceTracker(rate, budget), ReferenceTracker(rate, budget)
        for i, (missed, prefix) in enumerate(_zipf_requests(3_000, 1_500, seed=3)):
            new.lookup(missed, prefix)
            ref.lookup(missed, prefix)
            if i == 1_500:
                new = _reloaded(new)
        _same(new, ref)
        assert new.tracked > 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "remove", "find"]), hashes(pool=3_000)), max_size=300
    )
)
def test_block_index_equals_a_dict(ops):
    index, ref = BlockIndex(), {}
    for op, h in ops:
        if op == "add" and h not in ref:
            k = index.add(h)
            assert k not in ref.values()
            ref[h] = k
        elif op == "remove":
            assert index.remove(h) == ref.pop(h, -1)
        assert index.find(h) == ref.get(h, -1)
    assert len(index) == len(ref)
    assert sorted(index.ids()) == sorted(ref.values())
    assert dict(zip(index.hashes(index.ids()), index.ids(), strict=True)) == ref
    copy = index.copy()
    assert all(copy.find(h) == k for h, k in ref.items())


def test_block_index_grows_and_shrinks_back_through_many_removals():
    rng = random.Random(5)
    index, ref = BlockIndex(), {}
    for _ in range(40_000):
        h = rng.getrandbits(rng.choice((8, 16, 64, 64, 64)))
        if h in ref and rng.random() < 0.5:
            assert index.remove(h) == ref.pop(h)
        elif h not in ref:
            ref[h] = index.add(h)
    assert all(index.find(h) == k for h, k in ref.items())
    assert len(index) == len(ref) and index.capacity <= len(ref) + len(index.free)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["store", "load", "pop"]), hashes(pool=30)), max_size=200)
)
def test_resident_blocks_equal_a_dict_of_flags(ops):
    resident, ref = ResidentBlocks(), OrderedDict()
    for op, h in ops:
        if op == "store":
            resident.store(h)
            ref[h] = False
        elif op == "load":
            assert resident.load(h) == (h in ref)
            if h in ref:
                ref[h] = True
        else:
            assert resident.pop(h) == ref.pop(h, None)
        assert len(resident) == len(ref) and (h in resident) == (h in ref)
    assert resident.never_loaded() == sum(1 for v in ref.values() if not v)
    assert dict(resident.items()) == dict(ref)
    assert dict(resident.copy().items()) == dict(ref)


def _events(seed: int, n: int):
    """GPU stores (prefix chains), GPU evictions, CPU stores, loads and evictions over hashes of
    every kind the arrays hold (64-bit, negative, 128-bit)."""
    from kvoffload.kvevents.decode import REMOVED, STORED, Batch, Event

    rng = random.Random(seed)
    pool = [rng.choice(EDGE[:-1]) + i if i % 7 == 0 else rng.getrandbits(64) for i in range(400)]
    pool += [-(rng.getrandbits(63)) for _ in range(50)] + [rng.getrandbits(128) for _ in range(50)]
    pool = list(dict.fromkeys(pool))
    for t in range(n):
        start = rng.randrange(len(pool) - 8)
        blocks = tuple(pool[start : start + rng.randint(1, 8)])
        parent = pool[start - 1] if start and rng.random() < 0.7 else None
        events = [Event(STORED, blocks, "GPU", 16, None, parent)]
        if rng.random() < 0.5:
            events.append(Event(STORED, tuple(rng.sample(pool, 3)), "CPU"))
        if rng.random() < 0.3:
            events.append(Event(REMOVED, tuple(rng.sample(pool, 4)), "CPU"))
        if rng.random() < 0.3:
            events.append(Event(REMOVED, tuple(rng.sample(pool, 4)), "GPU"))
        yield Batch(float(t), 0, events)


def test_a_saved_state_with_every_kind_of_hash_continues_exactly(tmp_path):
    from kvoffload.kvevents import persist
    from kvoffload.kvevents.state import TargetEvents

    for rate, budget in ((1.0, None), (1.0, 150)):
        batches = list(_events(seed=9, n=600))
        whole, half = TargetEvents(rate, budget), TargetEvents(rate, budget)
        for seq, batch in enumerate(batches):
            whole.ingest(batch, seq, 0)
            if seq < 300:
                half.ingest(batch, seq, 0)
        path = persist.state_path(tmp_path, "t:1")
        persist.save(half, "t:1", path)
        loaded = persist.load(path, "t:1", rate, budget)
        assert loaded is not None
        resumed = loaded.events
        for seq, batch in enumerate(batches[300:], start=300):
            resumed.ingest(batch, seq, 0)
        a, b = whole.engines[0], resumed.engines[0]
        assert a.tracker.histogram._fw.tree == b.tracker.histogram._fw.tree
        assert (a.tracker.histogram.cold, a.tracker.threshold) == (
            b.tracker.histogram.cold,
            b.tracker.threshold,
        )
        assert whole.never_loaded_blocks() == resumed.never_loaded_blocks()
        assert whole.cpu_loaded_blocks() == resumed.cpu_loaded_blocks() > 0
        assert sorted(a.cpu_resident.items()) == sorted(b.cpu_resident.items())
