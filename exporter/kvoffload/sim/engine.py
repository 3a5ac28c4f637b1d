"""One vLLM engine core (one data-parallel rank) as a discrete-event model of its steps.

Its timing decides where offloading's cost lands (queue time, TTFT, one scrape late), as on vLLM.
Its rules are in docs/scenarios.md ("What is modelled": transfers, steps)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import vllm_families as mf
from .config import Scenario, Sizing
from .cpu_tier import CpuTier, SecondaryTier
from .gpu_cache import GpuPrefixCache
from .workload import RequestSpec

if TYPE_CHECKING:
    from .kv_events import KvEventLog


class Host(Protocol):
    """What an engine needs from the process around it (SimServer)."""

    metrics: mf.MetricStore

    def wall_time(self, t: float) -> float: ...

    def schedule(self, t: float, fn: Callable[..., None], *args: Any) -> None: ...

    def request_finished(self, record: dict[str, Any]) -> None: ...


_CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
_CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"
_T_LOOKUP = "vllm:kv_offload_tiering_lookup_"
_ACTIVE_PROMOTIONS = "vllm:kv_offload_tiering_active_promotion_jobs"
_ACTIVE_CASCADES = "vllm:kv_offload_tiering_active_cascade_jobs"


@dataclass
class Request:
    rid: int
    spec: RequestSpec
    hashes: tuple[int, ...]
    prompt: int
    t_engine: float  # arrival at the engine core (after tokenization)
    blocks: list[int] = field(default_factory=list)
    gpu_hit_blocks: int = 0
    ext_blocks: int = 0  # GPU blocks loaded from the CPU tier
    load_keys: list[int] = field(default_factory=list)
    promoted: int = 0  # chunks found in the secondary tier, read into the CPU tier first
    store_keys: list[int] = field(default_factory=list)
    load_s: float = 0.0  # wall time of the load copy (one rank)
    t_sched: float = 0.0
    t_done: float = 0.0
    remaining: int = 0  # output tokens still to decode
    t_last_token: float = 0.0
    # (ttft, queue, prefill, GPU-hit, CPU-hit, computed tokens), reported when it completes
    first: tuple[float, float, float, int, int, int] | None = None

    def computed(self, block_size: int) -> int:
        return self.prompt - (self.gpu_hit_blocks + self.ext_blocks) * block_size


@dataclass
class EngineTruth:
    """What really happened in one engine (ground truth the metrics only approximate)."""

    requests: int = 0
    prompt_tokens: int = 0
    gpu_hit_tokens: int = 0
    gpu_missed_tokens: int = 0
    loaded_tokens: int = 0
    loaded_bytes: int = 0
    stored_bytes: int = 0
    store_failures: int = 0
    stores_skipped: int = 0
    load_time_s: float = 0.0  # summed over ranks, like the counter
    store_time_s: float = 0.0
    ttft_saved_s: float = 0.0  # Σ over reloads of (recompute time − load − extra step)


class Engine:
    def __init__(
        self,
        scenario: Scenario,
        sizing: Sizing,
        index: int,
        host: Host,
        rng: random.Random,
        started_at: float,
    ) -> None:
        self.s = scenario
        self.sz = sizing
        self.index = index
        self.host = host
        self.rng = rng
        self.labels = (scenario.model_name, str(index))
        self.v033 = scenario.vllm_version == "0.33"
        self.bs = scenario.block_size
        self.bpc = scenario.blocks_per_chunk
        self.gpu = GpuPrefixCache(
            sizing.num_gpu_blocks,
            scenario.kv_cache_metrics_sample if scenario.kv_cache_metrics else 0.0,
            rng,
            self._on_residency,
        )
        self.cpu: CpuTier | None = None
        if scenario.offloading:
            self.cpu = CpuTier(
                sizing.cpu_num_chunks,
                sizing.chunk_bytes,
                scenario.eviction_policy,
                scenario.store_threshold,
            )
        self.secondary: SecondaryTier | None = None
        self.tier_label = ""
        if scenario.offloading and scenario.secondary_tier:
            chunks = int(scenario.secondary_gib * 2**30) // sizing.aligned_chunk_bytes
            self.secondary = SecondaryTier(scenario.secondary_tier, chunks)
            self.tier_label = f"1:{scenario.secondary_tier}"
        self.waiting: deque[Request] = deque()
        self.loading: dict[int, Request] = {}
        self.ready: deque[Request] = deque()
        self.running: list[Request] = []
        self.decoding: list[Request] = []
        # The engine core takes new requests and finished loads between steps, like vLLM's
        # busy loop: what arrives during a step waits for its end.
        self.inbox: list[Request] = []
        self.copied: list[tuple[Request, float]] = []
        self.in_step = False
        self.load_free_at = 0.0
        self.store_free_at = 0.0
        self.stepped = False
        self._now = 0.0  # time of the event being handled (for eviction callbacks)
        self.truth = EngineTruth()
        self.kv: KvEventLog | None = None  # KV events are off unless the host turns them on
        self._init_metrics(started_at)

    def enable_kv_events(self, log: KvEventLog) -> None:
        """Report what the caches do to `log` (vLLM's --kv-events-config), as DP rank `index`."""
        self.kv = log
        self.gpu.removed = []

    # -- helpers -------------------------------------------------------------------------------

    def _wall(self, t: float) -> float:
        return self.host.wall_time(t)

    @property
    def m(self) -> mf.MetricStore:
        return self.host.metrics

    def _chunk_keys(self, hashes: tuple[int, ...]) -> list[int]:
        """A chunk is keyed by the hash of its last GPU block; only full chunks exist."""
        bpc = self.bpc
        return [hashes[(c + 1) * bpc - 1] for c in range(len(hashes) // bpc)]

    # -- metrics -------------------------------------------------------------------------------

    def _init_metrics(self, t: float) -> None:
        """Children vLLM creates at start-up (eager series), all at 0 with the same _created."""
        w = self._wall(t)
        m, lab = self.m, self.labels
        if self.cpu is not None and self.v033:
            for tt in ("CPU_to_GPU", "GPU_to_CPU"):
                for fam in mf.LEGACY_OFFLOAD:
                    m.ensure(fam.name, (*lab, tt), w)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ):
            m.set(name, lab, 0.0, w)
        for reason in mf.WAITING_REASONS:
            m.set("vllm:num_requests_waiting_by_reason", (*lab, reason), 0.0, w)
        if self.cpu is not None and self.v033:
            for stage in mf.KV_FETCH_STAGES:
                m.set(mf.KV_FETCH.name, (*lab, stage), 0.0, w)
        for fam in mf.CACHE:
            if fam.kind == "counter" and fam.labels == mf.BASE:
                m.ensure(fam.name, lab, w)
        for src in mf.PROMPT_SOURCES:
            m.ensure("vllm:prompt_tokens_by_source", (*lab, src), w)
        for src in mf.CACHED_SOURCES:
            m.ensure(mf.CACHED_BY_SOURCE.name, (*lab, src), w)
        m.ensure("vllm:generation_tokens", lab, w)
        for reason in mf.FINISHED_REASONS:
            m.ensure("vllm:request_success", (*lab, reason), w)
        for name, fam in m.families.items():
            if (
                fam.kind == "histogram"
                and fam.labels == mf.BASE
                and not name.startswith("vllm:kv_offload")
            ):
                m.ensure(name, lab, w)
        self._cache_config_info(w)

    def _cache_config_info(self, w: float) -> None:
        s, sz = self.s, self.sz
        blocks_per_request = -(-s.max_model_len // s.block_size)
        values = {
            "engine": str(self.index),
            "block_size": str(s.block_size),
            "effective_attention_block_size": str(s.block_size),
            "enable_prefix_caching": "True",
            "gpu_memory_utilization": str(s.gpu_memory_utilization),
            # vLLM sums num_gpu_blocks over DP engines in the frontend but repeats it per engine
            "num_gpu_blocks": str(sz.num_gpu_blocks * s.dp),
            "kv_cache_size_tokens": str(sz.kv_cache_size_tokens),
            "kv_cache_max_concurrency": str(sz.num_gpu_blocks / blocks_per_request),
            "kv_cache_memory_bytes": str(s.kv_cache_memory_bytes)
            if s.kv_cache_memory_bytes is not None
            else "None",
            "kv_offloading_size": str(float(s.cpu_gib)) if s.cpu_gib is not None else "None",
            "kv_offloading_backend": "native",
        }
        names, vals = mf.cache_config_labels(self.s.vllm_version, values)
        self.m.set_info("vllm:cache_config_info", names, vals, w)

    def _first_step(self, w: float) -> None:
        """Series the offloading connector creates on the engine's first scheduler step."""
        self.stepped = True
        if self.cpu is None or not self.v033:
            return
        m, lab, sz = self.m, self.labels, self.sz
        m.set(
            mf.CONFIG_INFO.name,
            (
                *lab,
                str(sz.cpu_num_chunks),
                str(self.bpc),
                str(sz.cpu_kv_cache_size_bytes),
                str(sz.cpu_num_chunks * self.bpc * self.bs),
            ),
            1.0,
            w,
        )
        m.ensure(mf.STORES_SKIPPED.name, lab, w)

    def _record_step(self, t: float) -> None:
        """Gauges as of an engine step (they keep this value until the next step)."""
        w = self._wall(t)
        if not self.stepped:
            self._first_step(w)
        m, lab = self.m, self.labels
        deferred = len(self.loading) + len(self.ready)
        m.set("vllm:num_requests_running", lab, float(len(self.running)), w)
        m.set("vllm:num_requests_waiting", lab, float(len(self.waiting) + deferred), w)
        by_reason = "vllm:num_requests_waiting_by_reason"
        m.set(by_reason, (*lab, "capacity"), float(len(self.waiting)), w)
        m.set(by_reason, (*lab, "deferred"), float(deferred), w)
        m.set("vllm:kv_cache_usage_perc", lab, self.gpu.usage(), w)
        if self.cpu is not None and self.v033:
            m.set(mf.KV_FETCH.name, (*lab, "in_progress"), float(len(self.loading)), w)
            m.set(mf.KV_FETCH.name, (*lab, "completed_waiting"), float(len(self.ready)), w)
            usage, write, read = self.cpu.usage()
            m.set("vllm:kv_offload_cpu_cache_usage_perc", lab, usage, w)
            m.set("vllm:kv_offload_cpu_cache_write_usage_perc", lab, write, w)
            m.set("vllm:kv_offload_cpu_cache_read_usage_perc", lab, read, w)
        if self.secondary is not None:
            tier = (*lab, self.tier_label)
            promoting = sum(1 for q in self.loading.values() if q.promoted)
            m.set(_ACTIVE_PROMOTIONS, tier, float(promoting), w)
            m.set(_ACTIVE_CASCADES, tier, 0.0, w)  # cascades finish with their store

    def _transfer_metrics(self, load: bool, n_blocks: int, rank_s: float, t: float) -> None:
        """Counters for one finished copy job: every TP rank moved bytes/TP in `rank_s`."""
        w = self._wall(t)
        m, lab, tp = self.m, self.labels, self.s.tp
        total_bytes = n_blocks * self.sz.block_bytes
        rank_bytes = total_bytes / tp
        total_time = rank_s * tp
        legacy = (*lab, "CPU_to_GPU" if load else "GPU_to_CPU")
        m.inc("vllm:kv_offload_total_bytes", legacy, total_bytes, w)
        m.inc("vllm:kv_offload_total_time", legacy, total_time, w)
        m.observe("vllm:kv_offload_size", legacy, rank_bytes, w, times=tp)
        d = "load" if load else "store"
        m.inc(f"vllm:kv_offload_{d}_bytes", lab, total_bytes, w)
        m.inc(f"vllm:kv_offload_{d}_time", lab, total_time, w)
        m.observe(f"vllm:kv_offload_{d}_size", lab, rank_bytes, w, times=tp)
        if load:
            self.truth.loaded_bytes += total_bytes
            self.truth.load_time_s += total_time
        else:
            self.truth.stored_bytes += total_bytes
            self.truth.store_time_s += total_time

    def _promotion_s(self, chunks: int) -> float:
        """Seconds to read `chunks` from the secondary tier into the CPU tier."""
        if not chunks:
            return 0.0
        return chunks * self.sz.chunk_bytes / (self.s.secondary_read_gbps * 1e9)

    def _tier_lookups(self, keys: list[int], w: float) -> tuple[list[int], int]:
        """(chunks found in the CPU tier, how many found below it are promoted), chunk by chunk.

        It is TieringOffloadingSpec's lookup: it stops at a chunk in neither tier, counting both."""
        assert self.cpu is not None and self.secondary is not None
        in_cpu: list[int] = []
        promoted = primary_q = tier_q = 0
        for k in keys:
            primary_q += 1
            if self.cpu.lookup([k]):
                in_cpu.append(k)
                continue
            tier_q += 1
            if not self.secondary.lookup([k]):
                break
            promoted += 1
        m, lab = self.m, self.labels
        m.inc(_CHUNK_QUERIES, (*lab, "0:primary"), primary_q, w)
        m.inc(_CHUNK_HITS, (*lab, "0:primary"), len(in_cpu), w)
        m.inc(_CHUNK_QUERIES, (*lab, self.tier_label), tier_q, w)
        m.inc(_CHUNK_HITS, (*lab, self.tier_label), promoted, w)
        if tier_q:  # the request asked a secondary tier: blocked a little, waited its reads
            blocking = 20e-6 * tier_q * self.rng.uniform(0.8, 1.2)
            m.observe(_T_LOOKUP + "sync_delay_seconds", lab, blocking, w)
            m.observe(_T_LOOKUP + "async_delay_seconds", lab, self._promotion_s(promoted), w)
        return in_cpu, promoted

    def _tier_transfer(self, direction: str, chunks: int, gbps: float, t: float) -> None:
        """A finished promotion ("read") or cascade ("write") job of `chunks` chunks."""
        w = self._wall(t)
        tier = (*self.labels, self.tier_label)
        size = chunks * self.sz.chunk_bytes
        self.m.inc(f"vllm:kv_offload_tiering_{direction}_bytes", tier, size, w)
        self.m.inc(f"vllm:kv_offload_tiering_{direction}_time", tier, size / (gbps * 1e9), w)

    def _on_residency(self, lifetime: float, idle: float, gaps: list[float]) -> None:
        w = self._wall(self._now)
        m, lab = self.m, self.labels
        m.observe("vllm:kv_block_lifetime_seconds", lab, lifetime, w)
        m.observe("vllm:kv_block_idle_before_evict_seconds", lab, idle, w)
        for g in gaps:
            m.observe("vllm:kv_block_reuse_gap_seconds", lab, g, w)

    # -- events --------------------------------------------------------------------------------

    def arrive(self, t: float, req: Request) -> None:
        if self.in_step:
            self.inbox.append(req)  # queued when the running step ends (t_engine then)
            return
        self.waiting.append(req)
        self._maybe_step(t)

    def _rank_copy_s(self, n_blocks: int, gbps: float) -> float:
        rank_bytes = n_blocks * self.sz.block_bytes / self.s.tp
        return rank_bytes / (gbps * 1e9) + self.s.hardware.transfer_latency_s

    def _admit(self, t: float, r: Request) -> bool:
        """Prefix lookups and block allocation; False if the GPU has no room (stays waiting)."""
        bs, bpc = self.bs, self.bpc
        hashes = r.hashes
        total_blocks = -(-r.prompt // bs)
        gpu_hit = self.gpu.hit_blocks(hashes, (r.prompt - 1) // bs)
        if not self.gpu.can_allocate(hashes, gpu_hit, total_blocks):
            return False
        self._now = t
        w = self._wall(t)
        m, lab = self.m, self.labels
        ext_blocks = 0
        load_keys: list[int] = []
        if self.cpu is not None:
            keys = self._chunk_keys(hashes)
            self.cpu.touch(keys)
            first = gpu_hit // bpc
            # whole chunks inside the first prompt-1 tokens (one token must be computed)
            last = (r.prompt - 1) // (bs * bpc)
            if self.secondary is not None:
                load_keys, r.promoted = self._tier_lookups(keys[first:last], w)
                hits = len(load_keys) + r.promoted
            else:
                hits = self.cpu.lookup(keys[first:last]) if last > first else 0
                load_keys = keys[first : first + hits]
            if hits:
                ext_blocks = (first + hits) * bpc - gpu_hit
            else:
                load_keys = []
            delay = (15e-6 + 0.25e-6 * len(keys)) * self.rng.uniform(0.8, 1.2)
            m.observe("vllm:kv_offload_lookup_sync_delay_seconds", lab, delay, w)
        r.blocks = self.gpu.allocate(hashes, gpu_hit, total_blocks, t)
        if self.kv is not None and self.gpu.removed:
            self.kv.gpu_removed(self.index, t, self.gpu.removed)
            self.gpu.removed.clear()
        r.gpu_hit_blocks = gpu_hit
        r.ext_blocks = ext_blocks
        hit_tok = gpu_hit * bs
        ext_tok = ext_blocks * bs
        m.inc("vllm:prefix_cache_queries", lab, r.prompt, w)
        m.inc("vllm:prefix_cache_hits", lab, hit_tok, w)
        if self.cpu is not None:
            m.inc("vllm:external_prefix_cache_queries", lab, r.prompt - hit_tok, w)
            m.inc("vllm:external_prefix_cache_hits", lab, ext_tok, w)
        m.inc(mf.CACHED_BY_SOURCE.name, (*lab, "device"), hit_tok, w)
        promoted_tok = min(r.promoted * bpc * bs, ext_tok)
        m.inc(mf.CACHED_BY_SOURCE.name, (*lab, "host"), ext_tok - promoted_tok, w)
        if promoted_tok:
            m.inc(mf.CACHED_BY_SOURCE.name, (*lab, "disk"), promoted_tok, w)
        tr = self.truth
        tr.gpu_hit_tokens += hit_tok
        tr.gpu_missed_tokens += r.prompt - hit_tok
        tr.loaded_tokens += ext_tok
        if ext_blocks:
            assert self.cpu is not None
            r.load_keys = load_keys
            self.cpu.begin_load(load_keys)
            # Promoted chunks are read into the CPU tier before the CPU-to-GPU load starts.
            start = max(t + self._promotion_s(r.promoted), self.load_free_at)
            rank_s = self._rank_copy_s(ext_blocks, self.s.hardware.load_gbps)
            end = start + rank_s
            self.load_free_at = end
            r.load_s = end - t
            self.loading[r.rid] = r
            self.host.schedule(end, self._load_copied, r, rank_s)
        return True

    def _load_copied(self, t: float, r: Request, rank_s: float) -> None:
        """Mark the load's copy done; it is noticed at the end of the running (or next idle) step.

        That is when vLLM's scheduler learns of it, to schedule the request in the step after."""
        if self.in_step:
            self.copied.append((r, rank_s))
        else:
            self.host.schedule(t + self.s.hardware.engine_step_s, self._load_done, r, rank_s)

    def _load_done(self, t: float, r: Request, rank_s: float, step: bool = True) -> None:
        self._now = t
        assert self.cpu is not None
        self.cpu.end_load(r.load_keys)
        g = r.gpu_hit_blocks
        self._cache(t, r, g, g + r.ext_blocks)  # the load's own GPU BlockStored
        self._transfer_metrics(True, r.ext_blocks, rank_s, t)
        if r.promoted:
            self._tier_transfer("read", r.promoted, self.s.secondary_read_gbps, t)
        del self.loading[r.rid]
        self.ready.append(r)
        if step and not self.in_step:
            self._maybe_step(t)
            if not self.in_step:
                self._record_step(t)

    def _prepare_store(self, t: float, r: Request) -> None:
        """vLLM's prepare_store for the request's full chunks, at schedule time."""
        assert self.cpu is not None
        w = self._wall(t)
        m, lab = self.m, self.labels
        keys = self._chunk_keys(r.hashes)
        # vLLM offers the chunks after a load's last one (_next_stored_block_idx), else all
        start = (r.gpu_hit_blocks + r.ext_blocks) // self.bpc if r.ext_blocks else 0
        d = self.cpu.prepare_store(keys[start:], t)
        if d.keys:
            # vLLM's _get_reqs_to_store touches all of the request's chunks after a store, so
            # the new chunks end up in prefix order too (first most recent), not insert order.
            self.cpu.touch(keys)
        if d.skipped:
            m.inc(mf.STORES_SKIPPED.name, lab, d.skipped, w)
            self.truth.stores_skipped += d.skipped
        if d.requested:
            m.observe("vllm:kv_offload_cpu_allocation_size", lab, d.requested, w)
        if d.failed:
            m.inc("vllm:kv_offload_allocation_failure", lab, 1, w)
            self.truth.store_failures += 1
        if self.kv is not None and d.evicted:
            self.kv.cpu_removed(self.index, t, d.evicted)
        r.store_keys = d.keys

    def _cache(self, t: float, r: Request, start: int, end: int) -> None:
        """Blocks [start, end) of the request now hold their KV (computed or loaded)."""
        if self.kv is None:
            self.gpu.cache(r.blocks, r.hashes, start, end)
            return
        runs: list[tuple[int, int]] = []
        self.gpu.cache(r.blocks, r.hashes, start, end, runs)
        cached = 0
        for a, b in runs:
            self.kv.gpu_stored(self.index, t, r.hashes, r.spec.segments, a, b, self.bs)
            cached += b - a
        self.kv.missed_resident_blocks += (end - start) - cached

    def _maybe_step(self, t: float) -> None:
        if self.in_step:
            return
        self._now = t
        batch: list[Request] = []
        budget = self.s.max_num_batched_tokens
        max_seqs = self.s.max_num_seqs
        bs = self.bs
        decoders = list(self.decoding)
        budget -= len(decoders)
        max_seqs -= len(decoders)
        while self.ready and len(batch) < max_seqs:
            need = self.ready[0].computed(bs)
            if batch and need > budget:
                break
            r = self.ready.popleft()
            batch.append(r)
            budget -= need
        while self.waiting and len(batch) + len(self.loading) + len(self.ready) < max_seqs:
            r = self.waiting[0]
            if batch and r.prompt > budget:
                break  # whole prompts only (no chunked prefill): wait for the next step
            if not self._admit(t, r):
                break  # not enough free GPU blocks: waiting for capacity
            self.waiting.popleft()
            if r.ext_blocks:
                continue  # deferred until its load is done
            batch.append(r)
            budget -= r.computed(bs)
        if not batch and not decoders:
            self._record_step(t)
            return
        compute = 0
        stored_chunks = 0
        for r in batch:
            r.t_sched = t
            self._cache(t, r, r.gpu_hit_blocks + r.ext_blocks, len(r.hashes))
            if self.cpu is not None:
                self._prepare_store(t, r)
                stored_chunks += len(r.store_keys)
            compute += r.computed(bs)
        hw = self.s.hardware
        duration = (
            hw.prefill_overhead_s
            + compute / self.sz.prefill_tokens_per_s
            + len(decoders) * hw.decode_s_per_seq
        )
        if self.cpu is not None:
            duration += hw.offload_step_overhead_s
            if batch:
                duration += hw.offload_prefill_overhead_s
            if hw.store_critical_gbps:
                duration += stored_chunks * self.sz.chunk_bytes / (hw.store_critical_gbps * 1e9)
        self.m.observe(
            "vllm:iteration_tokens_total", self.labels, compute + len(decoders), self._wall(t)
        )
        self.in_step = True
        self.running = batch + decoders
        self._record_step(t)
        self.host.schedule(t + duration, self._step_end, batch, decoders)

    def _step_end(self, t: float, batch: list[Request], decoders: list[Request]) -> None:
        self._now = t
        self.in_step = False
        self.running = []
        hw = self.s.hardware
        for r in self.inbox:
            r.t_engine = t
            self.waiting.append(r)
        self.inbox.clear()
        for r, rank_s in self.copied:
            self._load_done(t, r, rank_s, step=False)
        self.copied.clear()
        w = self._wall(t)
        for r in decoders:
            self.m.observe("vllm:inter_token_latency_seconds", self.labels, t - r.t_last_token, w)
            self.m.inc("vllm:generation_tokens", self.labels, 1, w)
            r.t_last_token = t
            r.remaining -= 1
            if r.remaining <= 0:
                self.decoding.remove(r)
                self.gpu.free(r.blocks)
                self.host.schedule(t + hw.frontend_overhead_s / 2, self._finish, r)
        for r in batch:
            r.t_done = t
            if r.spec.output_tokens > 1:
                r.remaining = r.spec.output_tokens - 1
                r.t_last_token = t
                self.decoding.append(r)
            else:
                self.gpu.free(r.blocks)
            if r.store_keys:
                n_blocks = len(r.store_keys) * self.bpc
                start = max(t, self.store_free_at)
                rank_s = self._rank_copy_s(n_blocks, hw.store_gbps)
                end = start + rank_s
                self.store_free_at = end
                self.host.schedule(end + hw.engine_step_s, self._store_done, r.store_keys, rank_s)
            self.host.schedule(t + hw.frontend_overhead_s / 2, self._first_token, r)
        self._maybe_step(t)
        if not self.in_step:
            self._record_step(t)

    def _store_done(self, t: float, keys: list[int], rank_s: float) -> None:
        self._now = t
        assert self.cpu is not None
        self.cpu.complete_store(keys)
        self._transfer_metrics(False, len(keys) * self.bpc, rank_s, t)
        if self.secondary is not None and keys:
            # Every completed CPU-tier store cascades to the tier below (its bytes counted for
            # all the job's chunks, as TieringMetricsTracker counts them).
            self.secondary.write(keys)
            self._tier_transfer("write", len(keys), self.s.secondary_write_gbps, t)
        if self.kv is not None:
            self.kv.cpu_stored(self.index, t, keys)
            if self.secondary is not None and keys:
                self.kv.tier_stored(self.index, t, keys, self.secondary.tier_type.upper())
        if not self.in_step:
            self._record_step(t)

    def _first_token(self, t: float, r: Request) -> None:
        """The API server emits the first token: request-level counters (and, for a prefill-
        only request, its completion)."""
        w = self._wall(t)
        m, lab, bs = self.m, self.labels, self.bs
        hit_tok = r.gpu_hit_blocks * bs
        ext_tok = r.ext_blocks * bs
        computed = r.prompt - hit_tok - ext_tok
        ttft = t - r.spec.t
        queue = r.t_sched - r.t_engine
        prefill = r.t_done - r.t_sched
        m.inc("vllm:prompt_tokens", lab, r.prompt, w)
        m.inc("vllm:prompt_tokens_by_source", (*lab, "local_compute"), computed, w)
        m.inc("vllm:prompt_tokens_by_source", (*lab, "local_cache_hit"), hit_tok, w)
        m.inc("vllm:prompt_tokens_by_source", (*lab, "external_kv_transfer"), ext_tok, w)
        m.inc("vllm:prompt_tokens_cached", lab, hit_tok + ext_tok, w)
        m.inc("vllm:generation_tokens", lab, 1, w)
        m.observe("vllm:request_prompt_tokens", lab, r.prompt, w)
        m.observe("vllm:request_prefill_kv_computed_tokens", lab, computed, w)
        m.observe("vllm:time_to_first_token_seconds", lab, ttft, w)
        m.observe("vllm:request_queue_time_seconds", lab, queue, w)
        m.observe("vllm:request_prefill_time_seconds", lab, prefill, w)
        m.observe("vllm:request_num_preemptions", lab, 0, w)
        tr = self.truth
        tr.requests += 1
        tr.prompt_tokens += r.prompt
        if ext_tok:
            recompute_s = ext_tok / self.sz.prefill_tokens_per_s
            tr.ttft_saved_s += recompute_s - r.load_s - self.s.hardware.engine_step_s
        r.first = (ttft, queue, prefill, hit_tok, ext_tok, computed)
        if r.spec.output_tokens <= 1:
            self._finish(t, r)

    def _finish(self, t: float, r: Request) -> None:
        """The last token reaches the client."""
        assert r.first is not None
        w = self._wall(t)
        m, lab = self.m, self.labels
        m.inc("vllm:request_success", (*lab, "length"), 1, w)
        m.observe("vllm:e2e_request_latency_seconds", lab, t - r.spec.t, w)
        if r.spec.output_tokens > 1:
            m.observe("vllm:request_decode_time_seconds", lab, t - r.t_done, w)
        self._report(t, r, *r.first)

    def _report(
        self,
        t: float,
        r: Request,
        ttft: float,
        queue: float,
        prefill: float,
        hit_tok: int,
        ext_tok: int,
        computed: int,
    ) -> None:
        self.host.request_finished(
            {
                "rid": r.rid,
                "t": r.spec.t,
                "model_name": self.s.model_name,
                "engine": str(self.index),
                "label": r.spec.label,
                "prompt_tokens": r.prompt,
                "gpu_hit_tokens": hit_tok,
                "cpu_hit_tokens": ext_tok,
                "computed_tokens": computed,
                "ttft_s": ttft,
                "queue_s": queue,
                "prefill_s": prefill,
                "load_s": r.load_s,
                "t_finished": t,
            }
        )
