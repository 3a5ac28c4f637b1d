"""The signal catalog: every derived figure, defined once (docs/architecture.md).

A figure is one formula (`analysis.formula`), evaluated by the sidecar and rendered as PromQL.
Undefined is None: absent from /metrics, null in JSON, never 0 or NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvoffload.analysis.context import Context
from kvoffload.analysis.formula import (
    ClampMin,
    Expr,
    FirstOf,
    GaugeMean,
    Increase,
    Minus,
    OrZero,
    PerSecond,
    Positive,
    Product,
    PythonOnly,
    Rate,
    Ratio,
    Sidecar,
    TimesWorldSize,
    Total,
    WhenOffloading,
)
from kvoffload.analysis.window import GroupStatic
from kvoffload.ingest.catalog import label_number

GIB = 2**30


# -- what PromQL cannot compute: figures from config-info label values -------------------------
def _block_size(static: GroupStatic) -> float | None:
    for labels in static.cache_config:
        value = label_number(labels, "block_size")
        if value:
            return value
    return None


def static_bytes_per_token(static: GroupStatic) -> float | None:
    """cpu_kv_cache_size_bytes / (chunks × blocks per chunk × block_size) (0.33 config info)."""
    block_size = _block_size(static)
    for labels in static.offload_config:
        size = label_number(labels, "cpu_kv_cache_size_bytes")
        chunks = label_number(labels, "cpu_num_chunks")
        per_chunk = label_number(labels, "cpu_blocks_per_chunk") or 1.0
        if size and chunks and block_size:
            return size / (chunks * per_chunk * block_size)
    return None


def kv_bytes_per_token(c: Context) -> float | None:
    return KV_BYTES_PER_TOKEN.value(c)


def gpu_side_bytes_per_token(c: Context) -> float | None:
    """Only when --kv-cache-memory-bytes was given: bytes per GPU × GPUs per engine."""
    for labels in c.static.cache_config:
        memory = label_number(labels, "kv_cache_memory_bytes")
        tokens = label_number(labels, "kv_cache_size_tokens")
        if memory and tokens:
            return memory * max(c.world_size, 1) / tokens
    return None


def _sum_of_all(values: list[float | None]) -> float | None:
    """The sum when every engine has the value (one missing: unknown, not a smaller sum)."""
    known = [v for v in values if v is not None]
    return float(sum(known)) if known and len(known) == len(values) else None


def cpu_capacity_bytes(c: Context) -> float | None:
    sizes = _sum_of_all(
        [label_number(lb, "cpu_kv_cache_size_bytes") for lb in c.static.offload_config]
    )
    if sizes is not None:
        return sizes
    # Older releases: --kv-offloading-size (GiB, total over TP ranks) on each engine's series.
    gib = _sum_of_all([label_number(lb, "kv_offloading_size") for lb in c.static.cache_config])
    return gib * GIB if gib is not None else None


def cpu_capacity_tokens(c: Context) -> float | None:
    tokens = _sum_of_all(
        [label_number(lb, "cpu_kv_cache_size_tokens") for lb in c.static.offload_config]
    )
    if tokens is not None:
        return tokens
    block_size = _block_size(c.static)
    blocks = _sum_of_all(
        [
            (
                n * (label_number(lb, "cpu_blocks_per_chunk") or 1.0)
                if (n := label_number(lb, "cpu_num_chunks")) is not None
                else None
            )
            for lb in c.static.offload_config
        ]
    )
    if blocks is not None and block_size:
        return blocks * block_size
    size = cpu_capacity_bytes(c)
    per_token = kv_bytes_per_token(c)
    if size is not None and per_token:
        return size // per_token
    return None


def gpu_capacity_tokens(c: Context) -> float | None:
    per_engine = _sum_of_all(
        [label_number(lb, "kv_cache_size_tokens") for lb in c.static.cache_config]
    )
    if per_engine is not None:
        return per_engine
    # num_gpu_blocks is already the DP total on every engine's series: take it once.
    for labels in c.static.cache_config:
        blocks = label_number(labels, "num_gpu_blocks")
        block_size = label_number(labels, "block_size")
        if blocks and block_size:
            return blocks * block_size
    return None


def gpu_capacity_bytes(c: Context) -> float | None:
    tokens = gpu_capacity_tokens(c)
    per_token = kv_bytes_per_token(c)
    return tokens * per_token if tokens is not None and per_token else None


# -- the formulas -------------------------------------------------------------------------------
_LABELS_WHY = "PromQL cannot turn a label value into a number"
_CPU_CAPACITY_BYTES = PythonOnly(
    cpu_capacity_bytes, f"kv_offload_config_info / kv_offloading_size label values: {_LABELS_WHY}"
)
_CPU_CAPACITY_TOKENS = PythonOnly(
    cpu_capacity_tokens, f"kv_offload_config_info / cache_config_info label values: {_LABELS_WHY}"
)
_GPU_CAPACITY_TOKENS = PythonOnly(
    gpu_capacity_tokens,
    f"cache_config_info label values (kv_cache_size_tokens, num_gpu_blocks "
    f"× block_size): {_LABELS_WHY}",
)
_GPU_CAPACITY_BYTES = PythonOnly(
    gpu_capacity_bytes, f"capacity tokens (label values) × KV bytes per token: {_LABELS_WHY}"
)

# Tokens served by the offload tier: tier-attributed in 0.33, any connector's before.
LOADED_TOKENS = FirstOf(Rate("cached_host", "cached_disk"), Rate("src_external"))
LOADED_TOKENS_SINCE_START = FirstOf(Total("cached_host", "cached_disk"), Total("src_external"))
STORED = Rate("store_bytes")
LOADED = OrZero(Rate("load_bytes"), like=STORED)  # vLLM <= 0.23 creates loads on first use
LOAD_TOKENS_PER_SECOND = TimesWorldSize(Ratio(Positive(LOADED_TOKENS), Rate("load_time")))
RECOMPUTE_TOKENS_PER_SECOND = Ratio(Rate("src_local_compute"), Rate("prefill_time_sum"))
KV_BYTES_PER_TOKEN = FirstOf(
    PythonOnly(
        lambda c: static_bytes_per_token(c.static),
        f"kv_offload_config_info and cache_config_info label values: {_LABELS_WHY}",
    ),
    # Bytes loaded per token loaded since the engines started: a window opening mid-run
    # splits a load's bytes and its tokens across its edge (−1.1% seen live).
    Ratio(Total("load_bytes"), LOADED_TOKENS_SINCE_START),
    Ratio(Rate("load_bytes"), LOADED_TOKENS),
    PythonOnly(lambda c: c.kv_bytes_per_token, "a setting of the sidecar (--kv-bytes-per-token)"),
    PythonOnly(gpu_side_bytes_per_token, f"cache_config_info label values: {_LABELS_WHY}"),
)


# -- the TTFT model's parts that are closed formulas of rates (analysis.ttft.observe) ----------
# Each is the verdict's own quantity over the same window; the verdict itself (the fitted cost,
# its range, the twin prediction) is not a formula of rates (docs/advisor.md, "What Prometheus
# alone shows").
MEAN_QUEUE = Ratio(Rate("queue_time_sum"), Rate("queue_time_count"))
REQUEST_RATE = PerSecond(Rate("ttft_count"))  # requests given a first token, per second
# Little's law: the mean number waiting for KV capacity is the request rate × the mean time
# each waits for it; a server without a tier has this queue too.
CAPACITY_QUEUE = Ratio(GaugeMean("waiting_capacity"), REQUEST_RATE)
MEAN_E2E = FirstOf(
    Ratio(Rate("e2e_sum"), Rate("e2e_count")), Ratio(Rate("ttft_sum"), Rate("ttft_count"))
)
LOAD_JOBS = OrZero(Rate("load_jobs"), like=STORED)  # created on the first load

# -- secondary tiers (TieringOffloadingSpec) ---------------------------------------------------
# Lookups of the secondary tiers, summed over them: the chunk spelling, else the block one
# (ingest.catalog names the releases). Every other tiering series is created on first use, so
# "none yet" is 0 wherever a secondary tier has been looked up.
TIER_QUERIES = FirstOf(Rate("tier_chunk_queries"), Rate("tier_block_queries"))
TIER_HIT_RATIO = FirstOf(
    Ratio(Rate("tier_chunk_hits"), Rate("tier_chunk_queries")),
    Ratio(Rate("tier_block_hits"), Rate("tier_block_queries")),
)
PRIMARY_HIT_RATIO = FirstOf(
    Ratio(Rate("primary_chunk_hits"), Rate("primary_chunk_queries")),
    Ratio(Rate("primary_block_hits"), Rate("primary_block_queries")),
)
TIER_READ = OrZero(Rate("tier_read_bytes"), like=TIER_QUERIES)
TIER_WRITE = OrZero(Rate("tier_write_bytes"), like=TIER_QUERIES)


def _tier_lazy(key: str) -> PerSecond:
    """A tiering counter per second, 0 where the secondary tiers were looked up."""
    return PerSecond(OrZero(Rate(key), like=TIER_QUERIES))


def loaded_tokens(c: Context) -> float:
    """Tokens served by the offload tier over the window (0 when none)."""
    return LOADED_TOKENS.value(c) or 0.0


@dataclass(frozen=True)
class Figure:
    """One derived figure: its JSON key, how it is exported, and its one formula.

    The formula gives the base unit; `export_scale` is base units per JSON unit (1e9 for GB/s in
    JSON, bytes/s in /metrics).
    """

    key: str
    metric: str
    unit: str
    help: str
    formula: Expr
    labels: tuple[tuple[str, str], ...] = ()
    export_scale: float = 1.0

    def compute(self, c: Context) -> float | None:
        value = self.formula.value(c)
        return value / self.export_scale if value is not None else None

    @property
    def promql_why_not(self) -> str | None:
        """Why PromQL cannot compute this figure at all (None: it can, maybe in part)."""
        return self.formula.why if isinstance(self.formula, PythonOnly) else None


def _share(key: str) -> Ratio:
    return Ratio(Rate(key), Rate("prompt_tokens"))


FIGURES: tuple[Figure, ...] = (
    Figure(
        "offload_hit_ratio",
        "kvoffload_offload_hit_ratio",
        "ratio",
        "Share of GPU-missed prompt tokens served from the CPU offload tier over the window.",
        # The external prefix-cache counters exist (at 0) without offloading: gate on it.
        WhenOffloading(
            Ratio(
                FirstOf(Rate("cached_host", "cached_disk"), Rate("ext_hits")), Rate("ext_queries")
            ),
            gate=True,
        ),
    ),
    Figure(
        "gpu_prefix_hit_ratio",
        "kvoffload_gpu_prefix_hit_ratio",
        "ratio",
        "Share of queried prompt tokens found in the GPU prefix cache over the window.",
        Ratio(Rate("prefix_hits"), Rate("prefix_queries")),
    ),
    Figure(
        "prompt_share_local_compute",
        "kvoffload_prompt_tokens_source_ratio",
        "ratio",
        "Share of prompt tokens by where they came from over the window.",
        _share("src_local_compute"),
        labels=(("source", "local_compute"),),
    ),
    Figure(
        "prompt_share_local_cache_hit",
        "kvoffload_prompt_tokens_source_ratio",
        "ratio",
        "Share of prompt tokens by where they came from over the window.",
        _share("src_local_cache_hit"),
        labels=(("source", "local_cache_hit"),),
    ),
    Figure(
        "prompt_share_external",
        "kvoffload_prompt_tokens_source_ratio",
        "ratio",
        "Share of prompt tokens by where they came from over the window.",
        _share("src_external"),
        labels=(("source", "external_kv_transfer"),),
    ),
    Figure(
        "load_gbps",
        "kvoffload_load_bandwidth_bytes_per_second",
        "GB/s",
        "CPU-to-GPU copy bandwidth per worker while loading (bytes / copy time).",
        WhenOffloading(Ratio(Rate("load_bytes"), Rate("load_time"))),
        export_scale=1e9,
    ),
    Figure(
        "store_gbps",
        "kvoffload_store_bandwidth_bytes_per_second",
        "GB/s",
        "GPU-to-CPU copy bandwidth per worker while storing (bytes / copy time).",
        WhenOffloading(Ratio(STORED, Rate("store_time"))),
        export_scale=1e9,
    ),
    Figure(
        "reuse_ratio",
        "kvoffload_reuse_ratio",
        "x",  # a multiple, not a share: above 1 when hot blocks are reloaded repeatedly
        "Bytes loaded back from the CPU tier per byte stored into it over the window.",
        WhenOffloading(Ratio(LOADED, STORED)),
    ),
    Figure(
        "wasted_bytes",
        "kvoffload_wasted_offload_bytes",
        "bytes",
        "Bytes stored minus bytes loaded over the window, floored at 0: a lower bound on "
        "offloaded KV never read back (exact when each reloaded block is read once).",
        WhenOffloading(
            ClampMin(
                Minus(
                    Increase("store_bytes"),
                    OrZero(Increase("load_bytes"), like=Increase("store_bytes")),
                )
            )
        ),
    ),
    Figure(
        "loaded_bytes",
        "kvoffload_loaded_bytes",
        "bytes",
        "Bytes copied from the CPU tier to the GPU over the window.",
        WhenOffloading(OrZero(Increase("load_bytes"), like=Increase("store_bytes"))),
    ),
    Figure(
        "stored_bytes",
        "kvoffload_stored_bytes",
        "bytes",
        "Bytes copied from the GPU to the CPU tier over the window.",
        WhenOffloading(Increase("store_bytes")),
    ),
    Figure(
        "store_rate_bytes_per_second",
        "kvoffload_store_rate_bytes_per_second",
        "B/s",
        "Wall-clock rate of bytes stored into the CPU tier.",
        WhenOffloading(PerSecond(STORED)),
    ),
    Figure(
        "kv_bytes_per_token",
        "kvoffload_kv_token_size_bytes",
        "bytes",
        "KV cache bytes per token over all workers (config info, else loaded bytes / tokens "
        "since start).",
        KV_BYTES_PER_TOKEN,
    ),
    Figure(
        "recompute_tokens_per_second",
        "kvoffload_recompute_tokens_per_second",
        "tokens/s",
        "Prefill compute throughput: locally computed prompt tokens / prefill time.",
        RECOMPUTE_TOKENS_PER_SECOND,
    ),
    Figure(
        "load_tokens_per_second",
        "kvoffload_load_tokens_per_second",
        "tokens/s",
        "Tokens restored from the CPU tier per second of copy time (per instance).",
        LOAD_TOKENS_PER_SECOND,
    ),
    Figure(
        "speedup",
        "kvoffload_load_speedup_ratio",
        "x",
        "Load tokens/s over recompute tokens/s: a throughput ratio, not the TTFT gain.",
        Ratio(LOAD_TOKENS_PER_SECOND, RECOMPUTE_TOKENS_PER_SECOND),
    ),
    Figure(
        "cpu_capacity_tokens",
        "kvoffload_cpu_capacity_tokens",
        "tokens",
        "Tokens the CPU offload tier holds, summed over engines.",
        _CPU_CAPACITY_TOKENS,
    ),
    Figure(
        "gpu_capacity_tokens",
        "kvoffload_gpu_capacity_tokens",
        "tokens",
        "Tokens the GPU KV cache holds, summed over engines.",
        _GPU_CAPACITY_TOKENS,
    ),
    Figure(
        "cpu_capacity_bytes",
        "kvoffload_cpu_capacity_bytes",
        "bytes",
        "Size of the CPU offload tier (pinned host memory), summed over engines.",
        _CPU_CAPACITY_BYTES,
    ),
    Figure(
        "gpu_capacity_bytes",
        "kvoffload_gpu_capacity_bytes",
        "bytes",
        "Size of the GPU KV cache in bytes (capacity tokens × KV bytes per token).",
        _GPU_CAPACITY_BYTES,
    ),
    Figure(
        "cpu_fill_seconds",
        "kvoffload_cpu_fill_seconds",
        "s",
        "Time to fill the CPU tier at the current store rate (capacity / store rate).",
        Ratio(
            Sidecar("kvoffload_cpu_capacity_bytes", cpu_capacity_bytes),
            WhenOffloading(PerSecond(STORED)),
        ),
    ),
    Figure(
        "gpu_turnover_seconds",
        "kvoffload_gpu_turnover_seconds",
        "s",
        "GPU KV capacity ÷ rate of prompt tokens written into it: how long an idle prefix "
        "survives on the GPU.",
        # Every prompt token the GPU prefix cache missed is computed or loaded into it.
        Ratio(
            Sidecar("kvoffload_gpu_capacity_tokens", gpu_capacity_tokens),
            PerSecond(Rate("src_local_compute", "src_external")),
        ),
    ),
    Figure(
        "stored_bytes_since_start",
        "kvoffload_stored_since_start_bytes",
        "bytes",
        "Bytes stored into the CPU tier since the engines started (raw counter).",
        WhenOffloading(Total("store_bytes")),
    ),
    Figure(
        "cpu_fill_ratio_since_start",
        "kvoffload_cpu_fill_since_start_ratio",
        "x",  # times the tier was filled: a multiple, not a share
        "Bytes stored since start ÷ CPU tier size: under 1 the tier has never been full.",
        Ratio(
            WhenOffloading(Total("store_bytes")),
            Sidecar("kvoffload_cpu_capacity_bytes", cpu_capacity_bytes),
        ),
    ),
    Figure(
        "mean_ttft_seconds",
        "kvoffload_mean_ttft_seconds",
        "s",
        "Mean time to first token over the window.",
        Ratio(Rate("ttft_sum"), Rate("ttft_count")),
    ),
    Figure(
        "mean_queue_seconds",
        "kvoffload_mean_queue_seconds",
        "s",
        "Mean queue time (includes asynchronous offload loads) over the window.",
        MEAN_QUEUE,
    ),
    Figure(
        "mean_prefill_seconds",
        "kvoffload_mean_prefill_seconds",
        "s",
        "Mean prefill time (first scheduled to first token) over the window.",
        Ratio(Rate("prefill_time_sum"), Rate("prefill_time_count")),
    ),
    Figure(
        "capacity_queue_seconds",
        "kvoffload_capacity_queue_seconds",
        "s",
        "Mean time a request waits for KV capacity over the window, by Little's law: mean "
        "requests waiting for capacity ÷ requests per second (a server without a tier has "
        "it too).",
        CAPACITY_QUEUE,
    ),
    Figure(
        "reload_wait_seconds",
        "kvoffload_reload_wait_seconds",
        "s",
        "Queue time per request that capacity queueing does not explain, floored at 0, "
        "over the window: on a server with a CPU tier, the wait of its reloads (the TTFT "
        "verdict's measured wait).",
        WhenOffloading(ClampMin(Minus(MEAN_QUEUE, CAPACITY_QUEUE)), gate=True),
    ),
    Figure(
        "requests_in_system",
        "kvoffload_requests_in_system",
        "requests",
        "Mean number of requests in the engine over the window, by Little's law: "
        "requests per second × mean end-to-end latency.",
        Product(REQUEST_RATE, MEAN_E2E),
    ),
    Figure(
        "reloaded_tokens_per_request",
        "kvoffload_reloaded_tokens_per_request",
        "tokens",
        "Prompt tokens reloaded from the CPU tier per request over the window.",
        # The external-source counters exist (at 0) without a tier: gate on it.
        WhenOffloading(Ratio(LOADED_TOKENS, Rate("ttft_count")), gate=True),
    ),
    Figure(
        "loads_per_request",
        "kvoffload_loads_per_request",
        "x",  # a count per request, not a share: above 1 when a request reloads twice
        "CPU-tier load jobs per request over the window (vLLM counts a job once per worker).",
        WhenOffloading(Ratio(LOAD_JOBS, Rate("ttft_count"))),
    ),
    Figure(
        "load_copy_seconds",
        "kvoffload_load_copy_seconds",
        "s",
        "Copy time of one CPU-to-GPU load job per worker over the window (copy only: the "
        "reload's wait is longer).",
        WhenOffloading(Ratio(Rate("load_time"), Rate("load_jobs"))),
    ),
    Figure(
        "gpu_kv_usage_ratio",
        "kvoffload_gpu_kv_usage_ratio",
        "ratio",
        "Mean share of GPU KV blocks held by running requests over the window.",
        GaugeMean("gpu_kv_usage"),
    ),
    Figure(
        "waiting_for_capacity",
        "kvoffload_requests_waiting_for_capacity",
        "requests",
        "Mean number of requests waiting for KV capacity over the window.",
        GaugeMean("waiting_capacity"),
    ),
    Figure(
        "preemptions_per_second",
        "kvoffload_preemptions_per_second",
        "1/s",
        "Rate of request preemptions over the window.",
        PerSecond(Rate("preemptions")),
    ),
    Figure(
        "allocation_failures_per_second",
        "kvoffload_allocation_failures_per_second",
        "1/s",
        "Rate of CPU-tier store attempts that found no free slot over the window.",
        # The family is lazy (first failure): 0, not absent, wherever stores exist.
        WhenOffloading(PerSecond(OrZero(Rate("allocation_failures"), like=STORED))),
    ),
    Figure(
        "tier_hit_ratio",
        "kvoffload_secondary_tier_hit_ratio",
        "ratio",
        "Share of the chunk lookups sent to the secondary tiers (below the CPU tier) that "
        "found the chunk there over the window, all secondary tiers together.",
        TIER_HIT_RATIO,
    ),
    Figure(
        "primary_tier_hit_ratio",
        "kvoffload_primary_tier_hit_ratio",
        "ratio",
        "Share of the tiering spec's chunk lookups of the CPU (primary) tier that found the "
        "chunk there over the window.",
        PRIMARY_HIT_RATIO,
    ),
    Figure(
        "tier_read_bytes_per_second",
        "kvoffload_secondary_tier_read_bytes_per_second",
        "B/s",
        "Wall-clock rate of bytes promoted from the secondary tiers into the CPU tier.",
        PerSecond(TIER_READ),
    ),
    Figure(
        "tier_write_bytes_per_second",
        "kvoffload_secondary_tier_write_bytes_per_second",
        "B/s",
        "Wall-clock rate of bytes cascaded from the CPU tier into the secondary tiers.",
        PerSecond(TIER_WRITE),
    ),
    Figure(
        "tier_read_gbps",
        "kvoffload_secondary_tier_read_bandwidth_bytes_per_second",
        "GB/s",
        "Secondary-tier read bandwidth while promoting (bytes read / read time).",
        Ratio(Rate("tier_read_bytes"), Rate("tier_read_time")),
        export_scale=1e9,
    ),
    Figure(
        "tier_write_gbps",
        "kvoffload_secondary_tier_write_bandwidth_bytes_per_second",
        "GB/s",
        "Secondary-tier write bandwidth while cascading (bytes written / write time).",
        Ratio(Rate("tier_write_bytes"), Rate("tier_write_time")),
        export_scale=1e9,
    ),
    Figure(
        "tier_promotion_failures_per_second",
        "kvoffload_secondary_tier_promotion_failures_per_second",
        "1/s",
        "Rate of failed promotion jobs (secondary tier to CPU) over the window.",
        _tier_lazy("tier_promotion_failures"),
    ),
    Figure(
        "tier_cascade_failures_per_second",
        "kvoffload_secondary_tier_cascade_failures_per_second",
        "1/s",
        "Rate of failed cascade jobs (CPU to secondary tier) over the window.",
        _tier_lazy("tier_cascade_failures"),
    ),
    Figure(
        "promotion_allocation_failures_per_second",
        "kvoffload_promotion_allocation_failures_per_second",
        "1/s",
        "Rate of promotions dropped because the CPU tier had no free slot for them.",
        _tier_lazy("promotion_allocation_failures"),
    ),
    Figure(
        "tier_active_promotions",
        "kvoffload_secondary_tier_active_promotions",
        "jobs",
        "Mean number of promotion jobs in flight over the window, all secondary tiers.",
        GaugeMean("tier_active_promotions"),
    ),
    Figure(
        "tier_active_cascades",
        "kvoffload_secondary_tier_active_cascades",
        "jobs",
        "Mean number of cascade jobs in flight over the window, all secondary tiers.",
        GaugeMean("tier_active_cascades"),
    ),
    Figure(
        "stores_skipped_per_second",
        "kvoffload_stores_skipped_per_second",
        "1/s",
        "Rate of CPU-tier stores skipped because the block was not yet seen store_threshold "
        "times (0 where the threshold is off: vLLM then has no such series).",
        WhenOffloading(PerSecond(OrZero(Rate("stores_skipped"), like=STORED))),
    ),
    Figure(
        "mean_allocation_chunks",
        "kvoffload_mean_allocation_chunks",
        "chunks",
        "Mean number of CPU chunks each store asked the CPU tier for over the window.",
        WhenOffloading(Ratio(Rate("alloc_size_sum"), Rate("alloc_size_count"))),
    ),
    Figure(
        "mean_lookup_seconds",
        "kvoffload_mean_lookup_seconds",
        "s",
        "Mean time one offload lookup call takes over the window.",
        Ratio(Rate("lookup_sync_sum"), Rate("lookup_sync_count")),
    ),
    Figure(
        "tier_lookup_blocking_seconds",
        "kvoffload_tier_lookup_blocking_seconds",
        "s",
        "Mean time a request's scheduling was blocked querying secondary tiers (tiering spec).",
        Ratio(Rate("tier_lookup_blocking_sum"), Rate("tier_lookup_blocking_count")),
    ),
    Figure(
        "tier_lookup_wait_seconds",
        "kvoffload_tier_lookup_wait_seconds",
        "s",
        "Mean wait from a request's first deferred secondary-tier lookup until it is scheduled: "
        "time-to-first-token the secondary tiers' lookups add (tiering spec).",
        Ratio(Rate("tier_lookup_wait_sum"), Rate("tier_lookup_wait_count")),
    ),
    Figure(
        "prompt_tokens_per_second",
        "kvoffload_prompt_tokens_per_second",
        "tokens/s",
        "Prompt tokens per second of wall clock over the window.",
        PerSecond(Rate("prompt_tokens")),
    ),
)
FIGURES_BY_KEY = {f.key: f for f in FIGURES}

FIGURE_KEYS = tuple(f.key for f in FIGURES)


def compute_figures(ctx: Context, figures: tuple[Figure, ...] = FIGURES) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for fig in figures:
        try:
            value = fig.compute(ctx)
        except ZeroDivisionError:
            value = None
        if value is not None and not math.isfinite(value):  # NaN/Inf are never published
            value = None
        if value is not None and fig.unit == "ratio" and value > 1.0:
            # A share above 1 is counters that cannot be believed (a part grew faster than its
            # whole): absent, not published; float rounding is let through as 1.
            value = 1.0 if value <= 1.0 + 1e-9 else None
        out[fig.key] = value
    return out


# The figures kept for each secondary tier apart (ingest.catalog keeps `<key>@<tier>` counters).
PER_TIER_FIGURES = tuple(
    FIGURES_BY_KEY[key]
    for key in (
        "tier_hit_ratio",
        "tier_read_bytes_per_second",
        "tier_write_bytes_per_second",
        "tier_read_gbps",
        "tier_write_gbps",
        "tier_promotion_failures_per_second",
        "tier_cascade_failures_per_second",
    )
)


def per_tier_metric(fig: Figure) -> str:
    """The sidecar's per-tier series of a tier figure: `kvoffload_tier_*{tier}`."""
    return fig.metric.replace("kvoffload_secondary_tier_", "kvoffload_tier_", 1)


def per_tier_figures(ctx: Context) -> dict[str, dict[str, float | None]]:
    """Each secondary tier's figures by its label ("1:fs"), from its own counters.

    Why: the group's tier figures add every tier, so a slow tier hides behind a fast one.
    """
    by_tier: dict[str, dict[str, float]] = {}
    for key, value in ctx.delta.inc.items():
        base, sep, tier = key.partition("@")
        if sep:
            by_tier.setdefault(tier, {})[base] = value
    out = {}
    for tier, inc in sorted(by_tier.items()):
        delta = replace(ctx.delta, inc=inc, gauge_avg={}, unknown=frozenset())
        out[tier] = compute_figures(replace(ctx, delta=delta), PER_TIER_FIGURES)
    return out
