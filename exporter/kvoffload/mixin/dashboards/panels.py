"""What every panel shares: units and descriptions from the catalog, row titles, shared texts.

A figure's unit and help come from `signals.FIGURES`: dashboards say what docs/metrics.md says."""

from __future__ import annotations

from kvoffload.analysis.advisor import ACTIONS
from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.mixin import grafana as g
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.renderings import record_name, rendering_for
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

# What the description of a stat pooling a figure over the selection says (the linter's
# mark, in tests/rules/rules_lint.py, for its stated rate() window).
POOLED = (
    "Across the selected engines and models: sums of rates over sums of rates from vLLM's "
    "series (the rule's formula pooled over its window), never an average of their ratios."
)

# Each advice as a number (PromQL cannot turn the `action` label into a value) and its colour:
# green/blue = nothing to change, yellow/orange = a change would help, red = the tier hurts.
ACTION_COLOURS = {
    "enable": "orange",
    "leave_off": "blue",
    "keep": "green",
    "grow": "orange",
    "shrink": "yellow",
    "store_threshold": "yellow",
    "disable": "red",
}
ACTION_CODES = {action: i + 1 for i, action in enumerate(ACTIONS)}
ACTION_MAPPINGS = g.value_mappings({ACTION_CODES[a]: (a, ACTION_COLOURS[a]) for a in ACTIONS})
# What the predicted TTFT change rests on (kvoffload_recommended_ttft_change_seconds' basis).
# Every ttft_change_basis the advice sets (analysis.verdict): before_after is a tier change on
# one server, measured before and after.
BASIS_CODES = {"measured": 1, "predicted": 2, "replicas": 3, "before_after": 4}
BASIS_MAPPINGS = g.value_mappings(
    {
        1: ("measured", "green"),
        2: ("predicted", "yellow"),
        3: ("replicas", "blue"),
        4: ("before/after", "purple"),
    }
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
    """The description of a panel showing figure `key`.

    The catalog's help text with the rule's window, the rule's name, then `extra`."""
    r = rendering_for(key)
    which = which or (r.windows[0] if r.windows else None)
    text = FIGURES_BY_KEY[key].help
    if which:
        text = text.replace("over the window", f"over {r.window(cfg, which)}")
    text = f"{text} Recording rule: {record_name(key, cfg, which)}."
    return f"{text} {extra}" if extra else text


def pooled_about(cfg: MixinConfig, key: str, extra: str = "") -> str:
    """The description of a stat pooling figure `key` over the selection.

    The catalog's words, then how it pools and over which window (the rule's)."""
    r = rendering_for(key)
    window = r.window(cfg, r.windows[0]) if r.windows else cfg.rate_window
    return about(cfg, key, f"{extra} {POOLED} Pooled over {window}.".strip())


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
