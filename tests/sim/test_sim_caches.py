"""The GPU prefix cache and the CPU tier on their own."""

from __future__ import annotations

import pytest

from kvoffload.sim.cpu_tier import CpuTier
from kvoffload.sim.gpu_cache import GpuPrefixCache
from kvoffload.sim.workload import PromptHasher


def test_chain_hashes_share_prefixes_only() -> None:
    h = PromptHasher(16)
    a = h.block_hashes(((1, 100), (7, 40)))
    b = h.block_hashes(((1, 100), (8, 40)))
    assert len(a) == 140 // 16
    assert a[:6] == b[:6]  # blocks fully inside segment 1
    assert a[6] != b[6]  # block 6 straddles the two segments
    assert h.block_hashes(((2, 100),))[0] != a[0]


def test_gpu_hit_is_whole_blocks_and_at_most_prompt_minus_one() -> None:
    gpu = GpuPrefixCache(20)
    hashes = tuple(range(100, 104))  # a 64-token prompt: 4 full blocks
    blocks = gpu.allocate(hashes, 0, 4, 0.0)
    gpu.cache(blocks, hashes, 0, 4)
    gpu.free(blocks)
    assert gpu.hit_blocks(hashes, (64 - 1) // 16) == 3
    assert gpu.hit_blocks(hashes, 10) == 4


def test_gpu_evicts_tail_first_lru() -> None:
    gpu = GpuPrefixCache(9)  # 8 usable blocks
    a = tuple(range(10, 16))
    blocks = gpu.allocate(a, 0, 6, 0.0)
    gpu.cache(blocks, a, 0, 6)
    gpu.free(blocks)
    assert gpu.usage() == 0
    b = tuple(range(50, 55))
    blocks_b = gpu.allocate(b, 0, 5, 1.0)  # 2 never-used blocks, then A's tail goes first
    assert gpu.usage() == pytest.approx(5 / 8)
    assert gpu.hit_blocks(a, 6) == 3  # A keeps its head: a partial prefix hit
    gpu.free(blocks_b)


def test_gpu_capacity_check_counts_touched_free_blocks() -> None:
    gpu = GpuPrefixCache(5)  # 4 usable
    a = (1, 2, 3)
    blocks = gpu.allocate(a, 0, 3, 0.0)
    gpu.cache(blocks, a, 0, 3)
    gpu.free(blocks)
    assert gpu.can_allocate(a, 3, 4)  # 3 hits + 1 new block
    assert not gpu.can_allocate(a, 3, 5)


def test_residency_sampling_reports_at_eviction() -> None:
    seen: list[tuple[float, float, list[float]]] = []
    gpu = GpuPrefixCache(3, sample_rate=1.0, on_evict_sampled=lambda *x: seen.append(x))
    a = (1, 2)
    blocks = gpu.allocate(a, 0, 2, 0.0)
    gpu.cache(blocks, a, 0, 2)
    gpu.free(blocks)
    for t in (1.0, 3.0):  # two prefix hits → one reuse gap of 2 s
        bl = gpu.allocate(a, 2, 2, t)
        gpu.free(bl)
    gpu.allocate((9, 8), 0, 2, 10.0)  # evicts both blocks of a
    assert len(seen) == 2
    lifetime, idle, gaps = seen[0]
    assert lifetime == 10.0 and idle == 7.0 and gaps == [2.0]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_cpu_store_lookup_evict(policy: str) -> None:
    cpu = CpuTier(4, 100, policy)
    d = cpu.prepare_store([1, 2, 3], 0.0)
    assert d.keys == [1, 2, 3] and d.requested == 3 and not d.failed
    assert cpu.lookup([1, 2, 3]) == 0  # stores still in flight are not hits
    assert cpu.usage()[1] == pytest.approx(3 / 4)
    cpu.complete_store(d.keys)
    assert cpu.lookup([1, 2, 3, 4]) == 3
    assert cpu.prepare_store([1, 2], 1.0).requested == 0  # already present: not stored again
    d = cpu.prepare_store([7, 8], 2.0)  # one free slot, one eviction
    cpu.complete_store(d.keys)
    assert len(cpu) == 4 and cpu.evicted_chunks == 1 and cpu.evicted_never_loaded == 1


def test_cpu_lru_touch_order_protects_prefix_heads() -> None:
    cpu = CpuTier(4, 1, "lru")
    cpu.complete_store(cpu.prepare_store([1, 2, 3, 4], 0.0).keys)
    cpu.touch([3, 4])
    cpu.complete_store(cpu.prepare_store([5, 6], 1.0).keys)
    assert cpu.lookup([3, 4]) == 2
    assert cpu.lookup([1]) == 0 and cpu.lookup([2]) == 0


def test_cpu_store_never_evicts_the_requests_own_chunks() -> None:
    cpu = CpuTier(3, 1, "lru")
    cpu.complete_store(cpu.prepare_store([1, 2, 3], 0.0).keys)
    # 1 is the least recent, but it is part of the request being stored: 2 and 3 go instead
    d = cpu.prepare_store([1, 4, 5], 1.0)
    assert d.keys == [4, 5] and sorted(d.evicted) == [2, 3] and cpu.lookup([1]) == 1
    # when only the request's own idle chunk could make room, the store fails, nothing evicted
    fail = CpuTier(1, 1, "lru")
    fail.complete_store(fail.prepare_store([1], 0.0).keys)
    d = fail.prepare_store([1, 2], 1.0)
    assert d.failed and d.evicted == [] and fail.lookup([1]) == 1


def test_arc_touch_after_a_store_does_not_promote_chunks_still_being_written() -> None:
    cpu = CpuTier(8, 1, "arc")
    keys = [1, 2, 3, 4]
    d = cpu.prepare_store(keys, 0.0)
    cpu.touch(keys)  # vLLM's touch right after prepare_store
    arc = cpu._policy
    assert list(arc.t1) == [4, 3, 2, 1] and not arc.t2  # in T1, first chunk most recent
    cpu.complete_store(d.keys)
    cpu.touch(keys)  # a real second access promotes
    assert not arc.t1 and list(arc.t2) == [4, 3, 2, 1]


def test_cpu_allocation_failure_when_pinned() -> None:
    cpu = CpuTier(3, 1, "lru")
    d = cpu.prepare_store([1, 2], 0.0)  # pinned while writing
    fail = cpu.prepare_store([3, 4], 0.0)
    assert fail.failed and fail.requested == 2 and fail.keys == []
    cpu.complete_store(d.keys)
    cpu.begin_load([1])  # pinned by a load
    ok = cpu.prepare_store([3, 4], 1.0)
    assert not ok.failed and cpu.lookup([1]) == 1 and cpu.lookup([2]) == 0
    cpu.end_load([1])
    assert cpu.num_pinned == 2  # the two new chunks are still being written
    assert CpuTier(0, 1).prepare_store([1], 0.0).failed


def test_cpu_store_threshold() -> None:
    cpu = CpuTier(10, 1, "lru", store_threshold=2)
    first = cpu.prepare_store([1, 2], 0.0)
    assert first.keys == [] and first.skipped == 2 and first.requested == 0
    second = cpu.prepare_store([1, 2, 3], 1.0)
    assert second.keys == [1, 2] and second.skipped == 1


def test_arc_prefers_keeping_reused_chunks() -> None:
    cpu = CpuTier(4, 1, "arc")
    cpu.complete_store(cpu.prepare_store([1, 2], 0.0).keys)
    cpu.touch([1, 2])  # seen twice: T2
    for k in range(10, 16):  # a scan of one-off chunks
        cpu.complete_store(cpu.prepare_store([k], 1.0).keys)
    assert cpu.lookup([1, 2]) == 2


def test_arc_beats_lru_on_a_tier_too_small_for_the_rag_traffic() -> None:
    # Through the engine (lookups, stores, the touch after each store): ARC keeps the documents
    # asked about again in T2 while one-off chunks churn through T1, where LRU mirrors the GPU.
    from dataclasses import replace

    from kvoffload.sim import SimServer, scenarios

    hits = {}
    for policy in ("lru", "arc"):
        sc = replace(scenarios.get("buffer-too-small"), eviction_policy=policy, duration_s=600.0)
        sim = SimServer(sc)
        sim.run()
        hits[policy] = sim.ground_truth(include_requests=False)["true_offload_hit_ratio"]
        if policy == "arc":
            arc = sim.engines[0][0].cpu._policy
            assert arc.t1 and arc.t2
    assert hits["lru"] < 0.01 and hits["arc"] > 0.05, hits
