"""vLLM's /metrics families, rendered from plain-Python state on a private registry.

The simulator needs virtual `_created` times, lazy children and resets; prometheus_client has none.
Names, HELP, labels and buckets are vLLM 0.33.0's (`vllm/v1/metrics/loggers.py`).
The "0.23" mode keeps only what 0.23.0 had."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

BASE = ("model_name", "engine")

# tests/fixtures/vllm-0.33-offload-sample.prom is a real 0.33 body these families must match.
# --- buckets (the defaults of vLLM's vllm/v1/metrics/loggers.py) -------------------------
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# vLLM's inter-token latency and iteration-token buckets.
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITERATION_TOKEN_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
RESIDENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
)
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8)
ALLOCATION_SIZE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
LOOKUP_SYNC_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1)
LOOKUP_ASYNC_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 10)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (request token histograms)."""
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


@dataclass(frozen=True)
class Family:
    name: str  # as registered in vLLM (a counter's samples add `_total`)
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...] = BASE
    buckets: tuple[float, ...] = ()


# --- HELP strings --------------------------------------------------------------------------------
H_TOTAL_BYTES = "Number of bytes offloaded by KV connector"
H_TOTAL_TIME = "Total time measured by all KV offloading operations"
H_SIZE = "Histogram of KV offload transfer size, in bytes."
H_CPU_USAGE = (
    "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, 1.0 = "
    "saturated). Sustained high values indicate transfers (stores or promotions) may be dropped "
    "due to insufficient capacity."
)
H_CPU_WRITE = (
    "Fraction of CPU KV-cache space currently pinned by in-flight stores that have not yet "
    "completed (0.0 = idle, 1.0 = saturated)."
)
H_CPU_READ = (
    "Fraction of CPU KV-cache space currently pinned by in-flight loads that have not yet "
    "completed (0.0 = idle, 1.0 = saturated)."
)
H_ALLOC_SIZE = (
    "Histogram of the number of CPU chunks requested by each KV offload prepare_store call."
)
H_STORES_SKIPPED = (
    "Number of KV offload stores skipped because the reuse threshold was not reached."
)
H_CONFIG_INFO = (
    "Static configuration of the KV offload managers of this engine instance. The configured "
    "offloading spec declares the label names, and each manager fills the values, so a series "
    "appears from the first scheduler step of its engine. A manager reports one series for each "
    "configuration it holds, and a label of its own tells the series apart. Each engine reports "
    "its own configuration, not the instance total."
)
H_WAITING_BY_REASON = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
    "status). Sum of all reasons equals vllm:num_requests_waiting."
)
H_KV_FETCH = (
    "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs "
    "an async KV load that has not started; 'in_progress' = load started and not yet reported "
    "finished; 'completed_waiting' = load finished, request not running yet."
)
H_CACHED_BY_SOURCE = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
    "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits."
)
H_SAMPLED = "Sampled metrics (controlled by --kv-cache-metrics-sample)."

TT = ("model_name", "engine", "transfer_type")

LEGACY_OFFLOAD = [
    Family("vllm:kv_offload_total_bytes", "counter", H_TOTAL_BYTES, TT),
    Family("vllm:kv_offload_total_time", "counter", H_TOTAL_TIME, TT),
    Family("vllm:kv_offload_size", "histogram", H_SIZE, TT, TRANSFER_SIZE_BUCKETS),
]

CPU_SPEC = [
    Family("vllm:kv_offload_cpu_cache_usage_perc", "gauge", H_CPU_USAGE),
    Family("vllm:kv_offload_cpu_cache_write_usage_perc", "gauge", H_CPU_WRITE),
    Family("vllm:kv_offload_cpu_cache_read_usage_perc", "gauge", H_CPU_READ),
    Family(
        "vllm:kv_offload_cpu_allocation_size",
        "histogram",
        H_ALLOC_SIZE,
        BASE,
        ALLOCATION_SIZE_BUCKETS,
    ),
]

FLAT_OFFLOAD = [
    Family(
        "vllm:kv_offload_load_bytes", "counter", "Total bytes loaded from offload storage to GPU."
    ),
    Family(
        "vllm:kv_offload_load_time",
        "counter",
        "Total load time from offload storage to GPU, in seconds.",
    ),
    Family(
        "vllm:kv_offload_load_size",
        "histogram",
        "Histogram of KV offload load operation size, in bytes.",
        BASE,
        TRANSFER_SIZE_BUCKETS,
    ),
    Family(
        "vllm:kv_offload_store_bytes", "counter", "Total bytes stored from GPU to offload storage."
    ),
    Family(
        "vllm:kv_offload_store_time",
        "counter",
        "Total store time from GPU to offload storage, in seconds.",
    ),
    Family(
        "vllm:kv_offload_store_size",
        "histogram",
        "Histogram of KV offload store operation size, in bytes.",
        BASE,
        TRANSFER_SIZE_BUCKETS,
    ),
    Family(
        "vllm:kv_offload_lookup_sync_delay_seconds",
        "histogram",
        "Histogram of the time spent in a single offload lookup call, in seconds.",
        BASE,
        LOOKUP_SYNC_BUCKETS,
    ),
    Family(
        "vllm:kv_offload_lookup_async_delay_seconds",
        "histogram",
        "Histogram of time between a request's offload lookup first deferring and the "
        "following lookup resolving, or request finish, in seconds.",
        BASE,
        LOOKUP_ASYNC_BUCKETS,
    ),
    Family(
        "vllm:kv_offload_allocation_failure",
        "counter",
        "Number of KV offload store allocation attempts that failed.",
    ),
]

CONFIG_INFO = Family(
    "vllm:kv_offload_config_info",
    "gauge",
    H_CONFIG_INFO,
    (
        "model_name",
        "engine",
        "cpu_num_chunks",
        "cpu_blocks_per_chunk",
        "cpu_kv_cache_size_bytes",
        "cpu_kv_cache_size_tokens",
    ),
)

STORES_SKIPPED = Family("vllm:kv_offload_stores_skipped", "counter", H_STORES_SKIPPED)

# TieringOffloadingSpec's own series (vllm/v1/kv_offload/tiering/base.py TieringOffloadingMetrics,
# PR #48798), labelled by tier ("0:primary" the CPU tier, "1:fs" the first below it). HELP
# strings are vLLM's where its source gives them (the byte, time, failure and lookup counters);
# the gauges' are written from what tiering/metrics.py sets them to.
TIER = (*BASE, "tier")
_T = "vllm:kv_offload_tiering_"
TIERING = [
    Family(
        _T + "read_bytes",
        "counter",
        "Total bytes read from secondary tiers into the primary tier.",
        TIER,
    ),
    Family(
        _T + "read_time",
        "counter",
        "Total time spent reading from secondary tiers into the primary tier, in seconds.",
        TIER,
    ),
    Family(
        _T + "write_bytes",
        "counter",
        "Total bytes written from the primary tier to secondary tiers.",
        TIER,
    ),
    Family(
        _T + "write_time",
        "counter",
        "Total time spent writing from the primary tier to secondary tiers, in seconds.",
        TIER,
    ),
    Family(
        _T + "promotion_job_failures",
        "counter",
        "Number of failed secondary-tier promotion jobs.",
        TIER,
    ),
    Family(
        _T + "cascade_job_failures",
        "counter",
        "Number of failed secondary-tier cascade jobs.",
        TIER,
    ),
    Family(_T + "chunk_queries", "counter", "Number of chunk lookup queries sent to tiers.", TIER),
    Family(_T + "chunk_hits", "counter", "Number of chunk lookup hits in tiers.", TIER),
    Family(
        _T + "promotion_allocation_failures",
        "counter",
        "Number of promotions that found no free primary-tier slot.",
    ),
    Family(_T + "active_promotion_jobs", "gauge", "Number of promotion jobs in flight.", TIER),
    Family(_T + "active_cascade_jobs", "gauge", "Number of cascade jobs in flight.", TIER),
    # vLLM 0.26.0's two (tiering/spec.py, its help text word for word): per request, no tier.
    Family(
        _T + "lookup_sync_delay_seconds",
        "histogram",
        "Histogram of total blocking time spent querying secondary tiers for a request, "
        "accumulated from first lookup until the request is allocated or finishes, in seconds.",
        BASE,
        LOOKUP_SYNC_BUCKETS,
    ),
    Family(
        _T + "lookup_async_delay_seconds",
        "histogram",
        "Histogram of wall-clock time from a request's first deferred secondary-tier lookup "
        "until the request is allocated or finishes, in seconds.",
        BASE,
        LOOKUP_ASYNC_BUCKETS,
    ),
]

QUEUE = [
    Family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    Family("vllm:num_requests_waiting_by_reason", "gauge", H_WAITING_BY_REASON, (*BASE, "reason")),
]
KV_FETCH = Family("vllm:num_requests_kv_fetch_by_stage", "gauge", H_KV_FETCH, (*BASE, "stage"))

CACHE = [
    Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    Family(
        "vllm:prefix_cache_queries",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    Family(
        "vllm:prefix_cache_hits",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    Family(
        "vllm:external_prefix_cache_queries",
        "counter",
        "External prefix cache queries from KV connector cross-instance cache sharing, in "
        "terms of number of queried tokens.",
    ),
    Family(
        "vllm:external_prefix_cache_hits",
        "counter",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
        "of number of cached tokens.",
    ),
    Family("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    Family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    Family(
        "vllm:prompt_tokens_by_source",
        "counter",
        "Number of prompt tokens by source.",
        (*BASE, "source"),
    ),
    Family(
        "vllm:prompt_tokens_cached", "counter", "Number of cached prompt tokens (local + external)."
    ),
]
CACHED_BY_SOURCE = Family(
    "vllm:prompt_tokens_cached_by_source", "counter", H_CACHED_BY_SOURCE, (*BASE, "source")
)

RESIDENCY = [
    Family(
        "vllm:kv_block_lifetime_seconds",
        "histogram",
        "Histogram of KV cache block lifetime from allocation to eviction. " + H_SAMPLED,
        BASE,
        RESIDENCY_BUCKETS,
    ),
    Family(
        "vllm:kv_block_idle_before_evict_seconds",
        "histogram",
        "Histogram of idle time before KV cache block eviction. " + H_SAMPLED,
        BASE,
        RESIDENCY_BUCKETS,
    ),
    Family(
        "vllm:kv_block_reuse_gap_seconds",
        "histogram",
        "Histogram of time gaps between consecutive KV cache block accesses. Only the most "
        "recent accesses are recorded (ring buffer). " + H_SAMPLED,
        BASE,
        RESIDENCY_BUCKETS,
    ),
]

# The per-request latency histograms (their buckets fixed, unlike the token counts').
REQUEST_TIMES = [
    Family(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        BASE,
        TTFT_BUCKETS,
    ),
    Family(
        "vllm:e2e_request_latency_seconds",
        "histogram",
        "Histogram of e2e request latency in seconds.",
        BASE,
        REQUEST_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        BASE,
        REQUEST_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:request_prefill_time_seconds",
        "histogram",
        "Histogram of time spent in PREFILL phase for request.",
        BASE,
        REQUEST_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:request_decode_time_seconds",
        "histogram",
        "Histogram of time spent in DECODE phase for request.",
        BASE,
        REQUEST_LATENCY_BUCKETS,
    ),
    Family(
        "vllm:inter_token_latency_seconds",
        "histogram",
        "Histogram of inter-token latency in seconds.",
        BASE,
        ITL_BUCKETS,
    ),
    Family(
        "vllm:iteration_tokens_total",
        "histogram",
        "Histogram of number of tokens per engine_step.",
        BASE,
        ITERATION_TOKEN_BUCKETS,
    ),
    Family(
        "vllm:request_num_preemptions",
        "histogram",
        "Histogram of the number of times a request was preempted.",
        BASE,
        tuple(float(b) for b in PREEMPTION_BUCKETS),
    ),
]
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
WAITING_REASONS = ("capacity", "deferred")

# vLLM 0.33.0 cache_config_info label set (every CacheConfig attribute) and 0.23.0's.
CACHE_CONFIG_LABELS_033 = (
    "_block_size_resolved",
    "block_size",
    "cache_dtype",
    "cache_hit_alignment_tokens",
    "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "hash_block_size",
    "is_attention_free",
    "kv_cache_dtype_skip_layers",
    "kv_cache_layout",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_cache_mode",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_cache_retention_interval",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
    "replayssm_buffer_len",
    "simple_cpu_offload_num_blocks",
    "skip_page_size_padded",
    "sliding_window",
    "swa_bounded_replay",
    "use_kda_recoverssm",
    "use_replayssm",
    "user_specified_block_size",
)
CACHE_CONFIG_LABELS_023 = (
    "_block_size_resolved",
    "block_size",
    "cache_dtype",
    "calculate_kv_scales",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "is_attention_free",
    "kv_cache_dtype_skip_layers",
    "kv_cache_memory_bytes",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_cache_mode",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
    "skip_page_size_padded",
    "sliding_window",
    "user_specified_block_size",
    "user_specified_mamba_block_size",
)
# Values that do not depend on the scenario (strings exactly as str() renders them in vLLM).
_CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "calculate_kv_scales": "False",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "simple_cpu_offload_num_blocks": "None",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
    "user_specified_mamba_block_size": "False",
}


def cache_config_labels(
    version: str, values: dict[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(label names, label values) of one engine's vllm:cache_config_info series."""
    names = CACHE_CONFIG_LABELS_033 if version == "0.33" else CACHE_CONFIG_LABELS_023
    merged = {**_CACHE_CONFIG_DEFAULTS, **values}
    return ("engine", *names), tuple(merged[n] for n in ("engine", *names))


def families_for(
    version: str,
    offloading: bool,
    stores_skipped: bool,
    kv_cache_metrics: bool,
    max_model_len: int,
    tiering: bool = False,
) -> list[Family]:
    """The families one vLLM process registers, in vLLM's registration order."""
    token_buckets = tuple(float(b) for b in buckets_1_2_5(max_model_len))
    fams: list[Family] = []
    if offloading:
        fams += LEGACY_OFFLOAD
        if version == "0.33":
            fams += CPU_SPEC
            if stores_skipped:
                fams.append(STORES_SKIPPED)
            fams += FLAT_OFFLOAD
            fams.append(CONFIG_INFO)
            if tiering:
                fams += TIERING
    fams += QUEUE
    if offloading and version == "0.33":
        fams.append(KV_FETCH)
    fams += CACHE
    if version == "0.33":
        fams.append(CACHED_BY_SOURCE)
    fams += [
        Family("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
        Family(
            "vllm:request_success",
            "counter",
            "Count of successfully processed requests.",
            (*BASE, "finished_reason"),
        ),
        Family(
            "vllm:request_prompt_tokens",
            "histogram",
            "Number of prefill tokens processed.",
            BASE,
            token_buckets,
        ),
        *REQUEST_TIMES,
        Family(
            "vllm:request_prefill_kv_computed_tokens",
            "histogram",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            BASE,
            token_buckets,
        ),
    ]
    if kv_cache_metrics:
        fams += RESIDENCY
    fams.append(
        Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", ())
    )
    return fams


class _Scalar:
    __slots__ = ("created", "value")

    def __init__(self, created: float) -> None:
        self.value = 0.0
        self.created = created


class _Hist:
    __slots__ = ("count", "counts", "created", "sum")

    def __init__(self, created: float, n: int) -> None:
        self.counts = [0] * (n + 1)  # last slot is +Inf
        self.sum = 0.0
        self.count = 0
        self.created = created


class MetricStore:
    """Children of every family, keyed by label values; a custom collector renders them.

    A family with no child renders as HELP/TYPE only, like vLLM's lazily created series."""

    # cache_config_info's label names vary per version, so its children carry their own names.

    def __init__(self, families: Sequence[Family]) -> None:
        self.families: dict[str, Family] = {f.name: f for f in families}
        self._children: dict[str, dict[tuple[str, ...], _Scalar | _Hist]] = {
            f.name: {} for f in families
        }
        self._info_labels: dict[str, tuple[str, ...]] = {}

    def has(self, name: str) -> bool:
        return name in self.families

    def _child(self, name: str, labels: tuple[str, ...], created: float) -> _Scalar | _Hist:
        children = self._children[name]
        c = children.get(labels)
        if c is None:
            fam = self.families[name]
            c = _Hist(created, len(fam.buckets)) if fam.kind == "histogram" else _Scalar(created)
            children[labels] = c
        return c

    def ensure(self, name: str, labels: tuple[str, ...], created: float) -> None:
        """Create a child now (eager series, or the first event of a lazy one)."""
        if name in self._children:
            self._child(name, labels, created)

    def inc(self, name: str, labels: tuple[str, ...], amount: float, now: float) -> None:
        if name in self._children:
            c = self._child(name, labels, now)
            assert isinstance(c, _Scalar)
            c.value += amount

    def set(self, name: str, labels: tuple[str, ...], value: float, now: float) -> None:
        if name in self._children:
            c = self._child(name, labels, now)
            assert isinstance(c, _Scalar)
            c.value = value

    def observe(
        self, name: str, labels: tuple[str, ...], value: float, now: float, times: int = 1
    ) -> None:
        if name in self._children:
            c = self._child(name, labels, now)
            assert isinstance(c, _Hist)
            i = bisect.bisect_left(self.families[name].buckets, value)
            c.counts[i] += times
            c.count += times
            c.sum += value * times

    def set_info(
        self, name: str, label_names: tuple[str, ...], labels: tuple[str, ...], now: float
    ) -> None:
        if name in self._children:
            self._info_labels[name] = label_names
            self.set(name, labels, 1.0, now)

    def value(self, name: str, labels: tuple[str, ...]) -> float | None:
        """Current value of a counter/gauge child (None if it does not exist): for tests."""
        c = self._children.get(name, {}).get(labels)
        if c is None:
            return None
        return c.count if isinstance(c, _Hist) else c.value

    def collect(self, timestamp: float | None = None) -> Iterator[Metric]:
        """Metric families as prometheus_client renders them; `timestamp` stamps every sample
        (virtual wall time, for scrapers of a sped-up clock)."""
        ts = timestamp
        for name, fam in self.families.items():
            children = self._children[name]
            names = self._info_labels.get(name, fam.labels)
            m = Metric(name, fam.help, fam.kind)
            for key, c in children.items():
                lab = dict(zip(names, key, strict=True))
                if isinstance(c, _Hist):
                    cum = 0
                    for bound, n in zip((*fam.buckets, float("inf")), c.counts, strict=True):
                        cum += n
                        m.add_sample(
                            name + "_bucket", {**lab, "le": floatToGoString(bound)}, cum, ts
                        )
                    m.add_sample(name + "_count", lab, c.count, ts)
                    m.add_sample(name + "_sum", lab, c.sum, ts)
                    m.add_sample(name + "_created", lab, c.created, ts)
                elif fam.kind == "counter":
                    m.add_sample(name + "_total", lab, c.value, ts)
                    m.add_sample(name + "_created", lab, c.created, ts)
                else:
                    m.add_sample(name, lab, c.value, ts)
            yield m


class StoreCollector:
    """A collector on the simulator's private registry that reads whatever store is current.

    A restart swaps the store, so the registry never needs re-registering."""

    def __init__(self, get_store: Callable[[], MetricStore]) -> None:
        self._get_store = get_store
        self.timestamp: float | None = None  # set around a stamped render

    def collect(self) -> Iterator[Metric]:
        yield from self._get_store().collect(self.timestamp)
