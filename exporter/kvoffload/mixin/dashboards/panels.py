"""What every panel shares: units and descriptions from the catalog, row titles, shared texts.

A panel showing one catalog figure takes its unit and description from `signals.FIGURES` (the
unit, and the help /metrics and docs/metrics.md also print), so dashboards say what the docs say.
"""

from __future__ import annotations

from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.mixin import grafana as g
from kvoffload.mixin.promql import MixinConfig, record_name, rendering_for
from kvoffload.sidecar.metrics import (
    ADVICE_METRICS,
    HOST_MEMORY_METRICS,
    KV_EVENT_METRICS,
    TTFT_METRICS,
)

# Title suffix of the rows whose panels read only what `serve --kv-events` exports; such rows
# are collapsed, so a dashboard without KV events shows no wall of empty panels.
NEEDS_KV_EVENTS = "(needs KV events)"
EXACT_ROW = f"Exact sizing {NEEDS_KV_EVENTS}"
DIAGNOSTICS_ROW = "vLLM's own offload diagnostics"
# What the description of a panel reading series only some vLLM versions or settings export
# says (kv_offload_config_info is 0.33's; stores_skipped needs store_threshold >= 2).
ONLY_WHERE = "Only where vLLM has the series"
# The cache_config_info labels an operator checks first for the CPU tier.
CONFIG_LABELS = (
    "kv_offloading_backend",
    "kv_offloading_size",
    "block_size",
    "num_gpu_blocks",
    "kv_cache_size_tokens",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "cache_dtype",
)
OFFLOAD_CONFIG_LABELS = (
    "cpu_num_chunks",
    "cpu_blocks_per_chunk",
    "cpu_kv_cache_size_bytes",
    "cpu_kv_cache_size_tokens",
)

# Grafana's unit for each unit of the catalog (signals.Figure.unit). The rules and the sidecar's
# /metrics carry base units (bytes/s where the JSON says GB/s).
GRAFANA_UNITS = {
    "ratio": "percentunit",  # a share of a whole, 0–1
    "x": g.TIMES,  # a ratio of like quantities that can pass 1: 13.1 reads "13.1×", not 1,310%
    "GB/s": "Bps",
    "B/s": "Bps",
    "bytes": "bytes",
    "s": "s",
    "tokens/s": "short",
    "tokens": "short",
    "requests": "short",
    "1/s": "ops",
    "jobs": "short",
    "chunks": "short",
}


def unit(key: str) -> str:
    """Grafana's unit of catalog figure `key`."""
    return GRAFANA_UNITS[FIGURES_BY_KEY[key].unit]


def about(cfg: MixinConfig, key: str, extra: str = "", which: str | None = None) -> str:
    """The description of a panel showing figure `key`: the catalog's help text (the words of
    /metrics and docs/metrics.md) with the rule's window, the rule's name, then `extra`."""
    r = rendering_for(key)
    which = which or (r.windows[0] if r.windows else None)
    text = FIGURES_BY_KEY[key].help
    if which:
        text = text.replace("over the window", f"over {r.window(cfg, which)}")
    text = f"{text} Recording rule: {record_name(key, cfg, which)}."
    return f"{text} {extra}" if extra else text


def sidecar_help(name: str) -> str:
    """The help text the sidecar's /metrics gives series `name`."""
    for table in (ADVICE_METRICS, KV_EVENT_METRICS, HOST_MEMORY_METRICS):
        if name in table:
            return table[name][2]
    for fig in FIGURES_BY_KEY.values():
        if fig.metric == name:
            return fig.help
    return TTFT_METRICS[name][1]


def gbps(cfg: MixinConfig) -> str:
    """The nominal link peak as a reader writes it (25 GB/s), for dashed-line captions."""
    return f"{cfg.link_peak_bytes_per_second / 1e9:g} GB/s"
