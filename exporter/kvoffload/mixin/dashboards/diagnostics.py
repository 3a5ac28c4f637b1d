"""The overview's row of vLLM's own offload diagnostics, from vLLM's series per engine.

What upstream's KV-cache dashboard shows of the offloading connector, so nobody needs both.
"""

from __future__ import annotations

from typing import Any

from kvoffload.mixin import grafana as g
from kvoffload.mixin.dashboards.panels import CONFIG_LABELS, OFFLOAD_CONFIG_LABELS, ONLY_WHERE
from kvoffload.mixin.dashboards.queries import PanelQueries

BY = "instance, engine"


def diagnostics_row(s: PanelQueries) -> list[Any]:
    """Lookup delay, transfer sizes, pinned slots, failed and skipped stores, then the config."""
    return [*_transfer_charts(s), *_config_tables(s)]


def _rate(s: PanelQueries, name: str, *matchers: str) -> str:
    return f"rate({s.raw(name, *matchers)}[$__rate_interval])"


def _quantile(s: PanelQueries, q: str, name: str, *matchers: str) -> str:
    """Quantile `q` of a vLLM histogram per engine."""
    return f"histogram_quantile({q}, sum by ({BY}, le) ({_rate(s, name + '_bucket', *matchers)}))"


Queries = dict[str, str]  # legend value → PromQL, one chart's series (PanelQueries.labelled)


def _queries(s: PanelQueries) -> tuple[Queries, Queries, Queries, Queries]:
    """The charts' query sets: lookup delays, transfer sizes, pinned slots, store outcomes."""
    lookup = {
        kind: _quantile(s, "0.99", f"kv_offload_lookup_{kind}_delay_seconds")
        for kind in ("sync", "async")
    }
    # Flat load/store histograms (0.24+), else the deprecated transfer_type mirror.
    mirror = {"load": 'transfer_type="CPU_to_GPU"', "store": 'transfer_type="GPU_to_CPU"'}
    sizes = {
        f"{direction} p{float(q) * 100:g}": (
            f"(\n{_quantile(s, q, f'kv_offload_{direction}_size')}\nor\n"
            f"{_quantile(s, q, 'kv_offload_size', mirror[direction])}\n)"
        )
        for direction in ("load", "store")
        for q in ("0.5", "0.99")
    }
    pinned = {
        kind: f"max by ({BY}) ({s.raw(f'kv_offload_cpu_cache_{kind}_usage_perc')})"
        for kind in ("write", "read")
    }
    stores = {
        "failed": f"sum by ({BY}) ({_rate(s, 'kv_offload_allocation_failure_total')})",
        "skipped": f"sum by ({BY}) ({_rate(s, 'kv_offload_stores_skipped_total')})",
    }
    return lookup, sizes, pinned, stores


def _transfer_charts(s: PanelQueries) -> list[Any]:
    """Lookup delay, transfer sizes, pinned slots, failed and skipped stores, per engine."""
    t = g.target
    lookup, sizes, pinned, stores = _queries(s)
    return [
        g.timeseries(
            "Offload lookup delay p99",
            "99th percentile of one offload lookup's wall time (vllm:kv_offload_lookup_sync_"
            "delay_seconds), and of a deferred lookup from its first retry to resolution "
            "(vllm:kv_offload_lookup_async_delay_seconds; a CPU-only tier never defers, so "
            "usually empty). Every prefill with a connector pays the sync lookup.",
            "s",
            [t(s.labelled("lookup", lookup), "{{instance}} engine {{engine}} {{lookup}}")],
            min_value=0,
            width=8,
        ),
        g.timeseries(
            "Transfer sizes",
            "Median and 99th percentile bytes of one load and one store job per worker "
            "(vllm:kv_offload_load_size, vllm:kv_offload_store_size; else the deprecated "
            "vllm:kv_offload_size by transfer_type). Small jobs pay the copy's fixed cost.",
            "bytes",
            [t(s.labelled("size", sizes), "{{instance}} engine {{engine}} {{size}}")],
            min_value=0,
            width=8,
        ),
        g.timeseries(
            "CPU tier slots pinned by writes and reads",
            "Share of CPU chunk slots pinned by in-flight stores (vllm:kv_offload_cpu_cache_"
            "write_usage_perc) and loads (…_read_usage_perc). Near 1 for writes, new stores "
            "find no free slot and fail.",
            "percentunit",
            [t(s.labelled("pinned", pinned), "{{instance}} engine {{engine}} {{pinned}}")],
            min_value=0,
            max_value=1,
            width=8,
        ),
        g.timeseries(
            "Failed and skipped stores",
            "Store attempts per second that found no free slot (vllm:kv_offload_allocation_"
            "failure_total) and store candidates rejected for being offered fewer than "
            "store_threshold times (vllm:kv_offload_stores_skipped_total: only with "
            "store_threshold >= 2). Neither block reaches the CPU tier.",
            "ops",
            [t(s.labelled("stores", stores), "{{instance}} engine {{engine}} {{stores}}")],
            min_value=0,
            width=8,
        ),
    ]


def _config_tables(s: PanelQueries) -> list[Any]:
    """vLLM's cache and CPU-tier config info, one table row per engine."""
    t = g.target
    config = ", ".join(("instance", "engine", *CONFIG_LABELS))
    offload_config = ", ".join(("instance", "engine", *OFFLOAD_CONFIG_LABELS))
    return [
        g.table(
            "Cache configuration",
            "vLLM's cache_config_info labels per engine: the offloading backend and size "
            "(GiB), the GPU KV cache's blocks and tokens, block size, memory utilisation.",
            [t(f"max by ({config}) ({s.raw_info('cache_config_info')})", instant=True, table=True)],
            [("A", "Info", "none")],
            width=8,
            height=8,
        ),
        g.table(
            "CPU tier configuration",
            f"{ONLY_WHERE} (vllm:kv_offload_config_info, vLLM 0.33+): the CPU tier's chunks, "
            "blocks per chunk, bytes and tokens per engine.",
            [
                t(
                    f"max by ({offload_config}) ({s.raw_info('kv_offload_config_info')})",
                    instant=True,
                    table=True,
                )
            ],
            [("A", "Info", "none")],
            width=8,
            height=8,
        ),
    ]
