"""The signal catalog: every derived figure, defined once (DESIGN.md §5).

A figure is computed from a group's `Delta` (counter increases over the window) and its
static facts (config-info labels). "Undefined" (zero denominator, offloading off, too little
data) is None: absent from /metrics, null in JSON — never 0 or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.vllm import label_number
from kvoffload.window import Delta, GroupStatic

GIB = 2**30


@dataclass(frozen=True)
class Context:
    delta: Delta
    static: GroupStatic
    world_size: int = 1
    kv_bytes_per_token: float | None = None  # from the user, when nothing exposes it

    def inc(self, *keys: str) -> float:
        return sum(self.delta.inc.get(k, 0.0) for k in keys)

    def has(self, key: str) -> bool:
        return key in self.delta.inc


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


# -- helpers shared by several figures ---------------------------------------------------------
def loaded_tokens(c: Context) -> float:
    """Tokens served by the offload tier: tier-attributed in 0.33, connector-wide before."""
    if c.has("cached_host") or c.has("cached_disk"):
        return c.inc("cached_host", "cached_disk")
    return c.inc("src_external")


def offload_hit_ratio(c: Context) -> float | None:
    if not c.static.offload_families:
        return None
    return _ratio(loaded_tokens(c) if c.has("cached_host") else c.inc("ext_hits"),
                  c.inc("ext_queries"))


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
    static = static_bytes_per_token(c.static)
    if static is not None:
        return static
    # Bytes loaded per token loaded, from the totals since the engine started: a window that
    # opens mid-run splits a load's bytes and its tokens across its edge (−1.1% seen live).
    life = c.static.lifetime
    tier = "cached_host" in life or "cached_disk" in life
    life_tokens = (life.get("cached_host", 0.0) + life.get("cached_disk", 0.0) if tier
                   else life.get("src_external", 0.0))
    dynamic = _ratio(life.get("load_bytes", 0.0), life_tokens) if c.has("load_bytes") else None
    if dynamic is None:
        dynamic = _ratio(c.inc("load_bytes"), loaded_tokens(c))
    if dynamic is not None:
        return dynamic
    if c.kv_bytes_per_token:
        return c.kv_bytes_per_token
    # GPU side, only when --kv-cache-memory-bytes was given: bytes per GPU × GPUs per engine.
    for labels in c.static.cache_config:
        memory = label_number(labels, "kv_cache_memory_bytes")
        tokens = label_number(labels, "kv_cache_size_tokens")
        if memory and tokens:
            return memory * max(c.world_size, 1) / tokens
    return None


def cpu_capacity_bytes(c: Context) -> float | None:
    sizes = [label_number(lb, "cpu_kv_cache_size_bytes") for lb in c.static.offload_config]
    if sizes and all(s is not None for s in sizes):
        return float(sum(sizes))  # type: ignore[arg-type]
    # Older releases: --kv-offloading-size (GiB, total over TP ranks) on each engine's series.
    gib = [label_number(lb, "kv_offloading_size") for lb in c.static.cache_config]
    if gib and all(g is not None for g in gib):
        return sum(gib) * GIB  # type: ignore[misc]
    return None


def cpu_capacity_tokens(c: Context) -> float | None:
    tokens = [label_number(lb, "cpu_kv_cache_size_tokens") for lb in c.static.offload_config]
    if tokens and all(t is not None for t in tokens):
        return float(sum(tokens))  # type: ignore[arg-type]
    block_size = _block_size(c.static)
    chunks = [
        (label_number(lb, "cpu_num_chunks"), label_number(lb, "cpu_blocks_per_chunk") or 1.0)
        for lb in c.static.offload_config
    ]
    if chunks and block_size and all(n is not None for n, _ in chunks):
        return sum(n * per for n, per in chunks) * block_size  # type: ignore[operator]
    size = cpu_capacity_bytes(c)
    per_token = kv_bytes_per_token(c)
    if size is not None and per_token:
        return size // per_token
    return None


def gpu_capacity_tokens(c: Context) -> float | None:
    per_engine = [label_number(lb, "kv_cache_size_tokens") for lb in c.static.cache_config]
    if per_engine and all(t is not None for t in per_engine):
        return float(sum(per_engine))  # type: ignore[arg-type]
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


def load_tokens_per_second(c: Context) -> float | None:
    # load_time is summed over TP×PP ranks copying in parallel: divide by the world size.
    tokens = loaded_tokens(c)
    seconds = c.inc("load_time") / max(c.world_size, 1)
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def recompute_tokens_per_second(c: Context) -> float | None:
    return _ratio(c.inc("src_local_compute"), c.inc("prefill_time_sum"))


def speedup(c: Context) -> float | None:
    load = load_tokens_per_second(c)
    compute = recompute_tokens_per_second(c)
    return load / compute if load and compute else None


def store_rate(c: Context) -> float | None:
    if not c.static.offload_families:
        return None
    return _ratio(c.inc("store_bytes"), c.delta.seconds)


def cpu_fill_seconds(c: Context) -> float | None:
    capacity = cpu_capacity_bytes(c)
    rate = store_rate(c)
    return capacity / rate if capacity and rate else None


def gpu_turnover_seconds(c: Context) -> float | None:
    """How long the GPU prefix cache keeps a block: capacity ÷ rate of tokens written to it
    (every prompt token it missed is computed or loaded into it)."""
    capacity = gpu_capacity_tokens(c)
    written = _ratio(c.inc("src_local_compute", "src_external"), c.delta.seconds)
    return capacity / written if capacity and written else None


def stored_since_start(c: Context) -> float | None:
    if not c.static.offload_families:
        return None
    return c.static.lifetime.get("store_bytes", 0.0)


def cpu_fill_ratio_since_start(c: Context) -> float | None:
    """Bytes stored since the engine started ÷ tier size: below 1, the tier was never full."""
    stored = stored_since_start(c)
    capacity = cpu_capacity_bytes(c)
    return stored / capacity if stored is not None and capacity else None


def wasted_bytes(c: Context) -> float | None:
    if not c.static.offload_families:
        return None
    return max(c.inc("store_bytes") - c.inc("load_bytes"), 0.0)


def _per_second(key: str) -> Callable[[Context], float | None]:
    return lambda c: _ratio(c.inc(key), c.delta.seconds) if c.has(key) else None


def _offload_only(fn: Callable[[Context], float | None]) -> Callable[[Context], float | None]:
    return lambda c: fn(c) if c.static.offload_families else None


def _gauge(key: str) -> Callable[[Context], float | None]:
    return lambda c: c.delta.gauge_avg.get(key)


@dataclass(frozen=True)
class Figure:
    """One derived figure: its JSON key, how it is exported, and how it is computed.

    `export_scale` turns the JSON unit into the metric's base unit (GB/s → bytes/s).
    """

    key: str
    metric: str
    unit: str
    help: str
    compute: Callable[[Context], float | None]
    labels: tuple[tuple[str, str], ...] = ()
    export_scale: float = 1.0


FIGURES: tuple[Figure, ...] = (
    Figure("offload_hit_ratio", "kvoffload_offload_hit_ratio", "ratio",
           "Share of GPU-missed prompt tokens served from the CPU offload tier over the window.",
           offload_hit_ratio),
    Figure("gpu_prefix_hit_ratio", "kvoffload_gpu_prefix_hit_ratio", "ratio",
           "Share of queried prompt tokens found in the GPU prefix cache over the window.",
           lambda c: _ratio(c.inc("prefix_hits"), c.inc("prefix_queries"))),
    Figure("prompt_share_local_compute", "kvoffload_prompt_tokens_source_ratio", "ratio",
           "Share of prompt tokens by where they came from over the window.",
           lambda c: _ratio(c.inc("src_local_compute"), c.inc("prompt_tokens")),
           labels=(("source", "local_compute"),)),
    Figure("prompt_share_local_cache_hit", "kvoffload_prompt_tokens_source_ratio", "ratio",
           "Share of prompt tokens by where they came from over the window.",
           lambda c: _ratio(c.inc("src_local_cache_hit"), c.inc("prompt_tokens")),
           labels=(("source", "local_cache_hit"),)),
    Figure("prompt_share_external", "kvoffload_prompt_tokens_source_ratio", "ratio",
           "Share of prompt tokens by where they came from over the window.",
           lambda c: _ratio(c.inc("src_external"), c.inc("prompt_tokens")),
           labels=(("source", "external_kv_transfer"),)),
    Figure("load_gbps", "kvoffload_load_bandwidth_bytes_per_second", "GB/s",
           "CPU-to-GPU copy bandwidth per worker while loading (bytes / copy time).",
           _offload_only(lambda c: _ratio(c.inc("load_bytes"), c.inc("load_time") * 1e9)),
           export_scale=1e9),
    Figure("store_gbps", "kvoffload_store_bandwidth_bytes_per_second", "GB/s",
           "GPU-to-CPU copy bandwidth per worker while storing (bytes / copy time).",
           _offload_only(lambda c: _ratio(c.inc("store_bytes"), c.inc("store_time") * 1e9)),
           export_scale=1e9),
    Figure("reuse_ratio", "kvoffload_reuse_ratio", "ratio",
           "Bytes loaded back from the CPU tier per byte stored into it over the window.",
           _offload_only(lambda c: _ratio(c.inc("load_bytes"), c.inc("store_bytes")))),
    Figure("wasted_bytes", "kvoffload_wasted_offload_bytes", "bytes",
           "Bytes stored minus bytes loaded over the window, floored at 0: a lower bound on "
           "offloaded KV never read back (exact when each reloaded block is read once).",
           wasted_bytes),
    Figure("loaded_bytes", "kvoffload_loaded_bytes", "bytes",
           "Bytes copied from the CPU tier to the GPU over the window.",
           _offload_only(lambda c: c.inc("load_bytes"))),
    Figure("stored_bytes", "kvoffload_stored_bytes", "bytes",
           "Bytes copied from the GPU to the CPU tier over the window.",
           _offload_only(lambda c: c.inc("store_bytes"))),
    Figure("store_rate_bytes_per_second", "kvoffload_store_rate_bytes_per_second", "B/s",
           "Wall-clock rate of bytes stored into the CPU tier.", store_rate),
    Figure("kv_bytes_per_token", "kvoffload_kv_token_size_bytes", "bytes",
           "KV cache bytes per token over all workers (config info, else loaded bytes / tokens).",
           kv_bytes_per_token),
    Figure("recompute_tokens_per_second", "kvoffload_recompute_tokens_per_second", "tokens/s",
           "Prefill compute throughput: locally computed prompt tokens / prefill time.",
           recompute_tokens_per_second),
    Figure("load_tokens_per_second", "kvoffload_load_tokens_per_second", "tokens/s",
           "Tokens restored from the CPU tier per second of copy time (per instance).",
           load_tokens_per_second),
    Figure("speedup", "kvoffload_load_speedup_ratio", "x",
           "Load tokens/s over recompute tokens/s: a throughput ratio, not the TTFT gain.",
           speedup),
    Figure("cpu_capacity_tokens", "kvoffload_cpu_capacity_tokens", "tokens",
           "Tokens the CPU offload tier holds, summed over engines.", cpu_capacity_tokens),
    Figure("gpu_capacity_tokens", "kvoffload_gpu_capacity_tokens", "tokens",
           "Tokens the GPU KV cache holds, summed over engines.", gpu_capacity_tokens),
    Figure("cpu_capacity_bytes", "kvoffload_cpu_capacity_bytes", "bytes",
           "Size of the CPU offload tier (pinned host memory), summed over engines.",
           cpu_capacity_bytes),
    Figure("gpu_capacity_bytes", "kvoffload_gpu_capacity_bytes", "bytes",
           "Size of the GPU KV cache in bytes (capacity tokens × KV bytes per token).",
           gpu_capacity_bytes),
    Figure("cpu_fill_seconds", "kvoffload_cpu_fill_seconds", "s",
           "Time to fill the CPU tier at the current store rate (capacity / store rate).",
           cpu_fill_seconds),
    Figure("gpu_turnover_seconds", "kvoffload_gpu_turnover_seconds", "s",
           "GPU KV capacity ÷ rate of prompt tokens written into it: how long an idle prefix "
           "survives on the GPU.", gpu_turnover_seconds),
    Figure("stored_bytes_since_start", "kvoffload_stored_since_start_bytes", "bytes",
           "Bytes stored into the CPU tier since the engines started (raw counter).",
           stored_since_start),
    Figure("cpu_fill_ratio_since_start", "kvoffload_cpu_fill_since_start_ratio", "ratio",
           "Bytes stored since start ÷ CPU tier size: under 1 the tier has never been full.",
           cpu_fill_ratio_since_start),
    Figure("mean_ttft_seconds", "kvoffload_mean_ttft_seconds", "s",
           "Mean time to first token over the window.",
           lambda c: _ratio(c.inc("ttft_sum"), c.inc("ttft_count"))),
    Figure("mean_queue_seconds", "kvoffload_mean_queue_seconds", "s",
           "Mean queue time (includes asynchronous offload loads) over the window.",
           lambda c: _ratio(c.inc("queue_time_sum"), c.inc("queue_time_count"))),
    Figure("gpu_kv_usage_ratio", "kvoffload_gpu_kv_usage_ratio", "ratio",
           "Mean share of GPU KV blocks held by running requests over the window.",
           _gauge("gpu_kv_usage")),
    Figure("waiting_for_capacity", "kvoffload_requests_waiting_for_capacity", "requests",
           "Mean number of requests waiting for KV capacity over the window.",
           _gauge("waiting_capacity")),
    Figure("preemptions_per_second", "kvoffload_preemptions_per_second", "1/s",
           "Rate of request preemptions over the window.", _per_second("preemptions")),
    Figure("allocation_failures_per_second", "kvoffload_allocation_failures_per_second", "1/s",
           "Rate of CPU-tier store attempts that found no free slot over the window.",
           _offload_only(lambda c: _ratio(c.inc("allocation_failures"), c.delta.seconds))),
    Figure("prompt_tokens_per_second", "kvoffload_prompt_tokens_per_second", "tokens/s",
           "Prompt tokens per second of wall clock over the window.",
           _per_second("prompt_tokens")),
)

FIGURE_KEYS = tuple(f.key for f in FIGURES)


def compute_figures(ctx: Context) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for fig in FIGURES:
        try:
            value = fig.compute(ctx)
        except ZeroDivisionError:
            value = None
        if value is not None and not math.isfinite(value):  # NaN/Inf are never published
            value = None
        out[fig.key] = value
    return out
