"""The overview's transfer, capacity and host-memory rows.

Is the link fast, is the tier the right size, is vLLM's memory safe: one function per row.
"""

from __future__ import annotations

from typing import Any

from kvoffload.mixin import grafana as g
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.dashboards.panels import about, gbps, sidecar_help, unit
from kvoffload.mixin.dashboards.queries import PanelQueries
from kvoffload.thresholds import Thresholds

_ADVISOR_HORIZON = Thresholds().reuse_horizon_seconds


def transfers_row(s: PanelQueries) -> list[Any]:
    """Copy bandwidth against the link and the floor, traffic per engine, pinned slots, failures."""
    cfg, t = s.cfg, g.target
    return [
        g.timeseries(
            "Copy bandwidth per worker",
            "Bytes per second of copy time (vLLM adds the times of all ranks: this is "
            f"per worker). Dashed blue: the {gbps(cfg)} nominal link peak, a reference and "
            "not a limit (a PCIe Gen5 x16 link does more); dashed orange: the "
            f"{cfg.transfer_slow_bytes_per_second / 1e9:g} GB/s floor of "
            "KVOffloadTransferSlow.",
            unit("load_gbps"),
            [
                t(s.rule("load_gbps"), "{{instance}} load (CPU→GPU)"),
                t(s.rule("store_gbps"), "{{instance}} store (GPU→CPU)"),
            ],
            min_value=0,
            lines=[
                (cfg.transfer_slow_bytes_per_second, "orange"),
                (cfg.link_peak_bytes_per_second, "blue"),
            ],
        ),
        g.timeseries(
            "Offload traffic per engine",
            "Load and store bytes per second per data-parallel engine, from the raw "
            "counters (flat names, else the deprecated transfer_type mirrors).",
            "Bps",
            [
                t(
                    s.offload_rate("load", "instance, engine"),
                    "{{instance}} engine {{engine}} load",
                ),
                t(
                    s.offload_rate("store", "instance, engine"),
                    "{{instance}} engine {{engine}} store",
                ),
            ],
        ),
        g.timeseries(
            "CPU tier slots pinned by transfers",
            "vllm:kv_offload_cpu_cache_usage_perc: share of CPU chunk slots pinned by "
            "in-flight stores and loads. Not occupancy: a full, idle tier reads 0.",
            "percentunit",
            [
                t(
                    f"max by (instance, engine) ({s.raw('kv_offload_cpu_cache_usage_perc')})",
                    "{{instance}} engine {{engine}}",
                )
            ],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "Allocation failures",
            "CPU-tier store attempts per second that found no free (unpinned) slot; "
            "those blocks are not offloaded.",
            unit("allocation_failures_per_second"),
            [t(s.rule("allocation_failures_per_second"), "{{instance}}")],
            min_value=0,
        ),
    ]


def capacity_rows(s: PanelQueries) -> list[Any]:
    """The capacity row: what the tiers hold and how fast they fill, then GPU pressure."""
    return [*_tier_size(s), *_gpu_pressure(s)]


def _tier_size(s: PanelQueries) -> list[Any]:
    """Capacities in tokens, the CPU tier's fill time, GPU KV usage per engine."""
    cfg, t = s.cfg, g.target
    slow = cfg.slow_window
    return [
        g.timeseries(
            "KV capacity in tokens",
            "Tokens the CPU tier and the GPU KV cache hold, from vLLM's config info "
            "(computed by the sidecar: PromQL cannot read numbers from labels). The "
            "CPU tier must be larger than the GPU cache to add hits.",
            unit("cpu_capacity_tokens"),
            [
                t(s.sidecar("kvoffload_cpu_capacity_tokens"), "{{target}} CPU tier"),
                t(s.sidecar("kvoffload_gpu_capacity_tokens"), "{{target}} GPU KV"),
            ],
            min_value=0,
        ),
        g.timeseries(
            "CPU tier fill time",
            f"Capacity over the store rate of the last {slow}: how long a stored "
            "block survives without reuse. Over "
            f"{cfg.oversized_fill_seconds / 3600:g} h the tier is oversized.",
            unit("cpu_fill_seconds"),
            [t(s.rule("cpu_fill_seconds"), "{{instance}}")],
            min_value=0,
            lines=[(cfg.oversized_fill_seconds, "orange")],
        ),
        g.timeseries(
            "GPU KV cache usage per engine",
            "vllm:kv_cache_usage_perc: share of GPU KV blocks held by running "
            "requests (cached but unreferenced prefix blocks count as free).",
            "percentunit",
            [
                t(
                    f"max by (instance, engine) ({s.raw('kv_cache_usage_perc')})",
                    "{{instance}} engine {{engine}}",
                )
            ],
            min_value=0,
            max_value=1,
            lines=[(cfg.pressure_gpu_kv_usage, "orange")],
        ),
    ]


def _gpu_pressure(s: PanelQueries) -> list[Any]:
    """How long prefixes survive on the GPU, the tier's fill since start, preemptions, waits."""
    cfg, t = s.cfg, g.target
    fast = cfg.rate_window
    return [
        g.timeseries(
            "How long a prefix survives on the GPU",
            "GPU KV capacity over the rate of prompt tokens written into it (computed "
            f"or loaded, {fast}): reuse gaps longer than this need the CPU tier. "
            f"Dashed: the advisor's {_ADVISOR_HORIZON:g} s reuse horizon.",
            unit("gpu_turnover_seconds"),
            [t(s.rule("gpu_turnover_seconds"), "{{instance}}")],
            min_value=0,
            lines=[(_ADVISOR_HORIZON, "orange")],
        ),
        g.timeseries(
            "CPU tier filled since start",
            about(
                cfg,
                "cpu_fill_ratio_since_start",
                "Under 1× the tier cannot have evicted anything.",
            ),
            unit("cpu_fill_ratio_since_start"),
            [t(s.rule("cpu_fill_ratio_since_start"), "{{instance}}")],
            min_value=0,
            lines=[(1.0, "orange")],
        ),
        g.timeseries(
            "Preemptions",
            f"Request preemptions per second over {fast}: the GPU KV cache ran out.",
            unit("preemptions_per_second"),
            [t(s.rule("preemptions_per_second"), "{{instance}}")],
            min_value=0,
            width=6,
        ),
        g.timeseries(
            "Waiting for KV capacity",
            f"Mean number of requests waiting for KV cache capacity over {fast}.",
            unit("waiting_for_capacity"),
            [t(s.rule("waiting_for_capacity"), "{{instance}}")],
            min_value=0,
            width=6,
        ),
    ]


def host_memory_row(cfg: MixinConfig) -> list[Any]:
    """vLLM's container memory as the sidecar reads it: will the pinned tier OOM it?"""
    t = g.target
    scope = f"{{{cfg.sidecar_selector}}}" if cfg.sidecar_selector else ""
    return [
        g.timeseries(
            "vLLM's container memory and its limit",
            f"{sidecar_help('kvoffload_host_memory_unreclaimable_bytes')} Beside it the shared "
            "memory, what the CPU tier takes (kvoffload_host_memory_tier_footprint_bytes: "
            "measured, or 2x its size until measured) and the limit; "
            f"KVOffloadHostMemoryNearLimit fires over {cfg.host_memory_near_limit_ratio:.0%} "
            "of it. Empty where the sidecar cannot see vLLM's cgroup "
            "(kvoffload_host_memory_read_info says why).",
            "bytes",
            [
                t(
                    f"kvoffload_host_memory_unreclaimable_bytes{scope}",
                    "{{instance}} unreclaimable",
                ),
                t(f"kvoffload_host_memory_shmem_bytes{scope}", "{{instance}} shared"),
                t(
                    f"kvoffload_host_memory_tier_footprint_bytes{scope}",
                    "{{instance}} CPU tier ({{basis}})",
                ),
                t(f"kvoffload_host_memory_limit_bytes{scope}", "{{instance}} limit"),
            ],
            min_value=0,
            width=16,
        ),
        g.timeseries(
            "OOM kills in vLLM's container",
            f"{sidecar_help('kvoffload_host_memory_oom_kills')} Per hour, over the range's "
            "rate window.",
            "short",
            [
                t(
                    f"increase(kvoffload_host_memory_oom_kills_total{scope}[$__rate_interval])",
                    "{{instance}}",
                )
            ],
            min_value=0,
            width=8,
        ),
    ]
