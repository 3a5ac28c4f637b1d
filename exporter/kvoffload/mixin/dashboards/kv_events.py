"""The overview's exact-sizing row: what only `serve --kv-events` measures.

The reuse curve, the tier's occupancy and the exact waste; collapsed, as it is empty without
KV events.
"""

from __future__ import annotations

from typing import Any

from kvoffload.mixin import grafana as g
from kvoffload.mixin.dashboards.panels import sidecar_help
from kvoffload.mixin.dashboards.queries import PanelQueries
from kvoffload.mixin.renderings import record_name


def exact_row(s: PanelQueries) -> list[Any]:
    """Three stats across, then two rows of two charts: the rectangle has no holes."""
    return [*_curve_stats(s), *_curve_charts(s), *_event_charts(s)]


def _curve_stats(s: PanelQueries) -> list[Any]:
    """The curve's headline: achievable and predicted hit ratios, predicted TTFT effect."""
    t = g.target
    return [
        g.stat(
            "Achievable offload hit ratio",
            "What an unbounded CPU tier would serve, from the KV-event curve "
            "(kvoffload_achievable_offload_hit_ratio).",
            "percentunit",
            [t(f"max({s.sidecar('kvoffload_achievable_offload_hit_ratio')})")],
            decimals=1,
            width=8,
        ),
        g.stat(
            "Predicted at the advised size",
            "Offload hit ratio the curve predicts at the recommended size, else at the "
            "current one (kvoffload_predicted_offload_hit_ratio).",
            "percentunit",
            [t(f"max({s.sidecar('kvoffload_predicted_offload_hit_ratio')})")],
            decimals=1,
            width=8,
        ),
        g.stat(
            "Predicted TTFT effect at the advised size",
            "Mean TTFT change per request a CPU tier of the advised size would cause "
            "against none, predicted from the curve and this engine's measured costs "
            "(kvoffload_predicted_offload_ttft_effect_seconds); negative = faster.",
            "s",
            [t(f"max({s.sidecar('kvoffload_predicted_offload_ttft_effect_seconds')})")],
            decimals=3,
            width=8,
            thresholds=[(0.0, "red")],
        ),
    ]


def _curve_charts(s: PanelQueries) -> list[Any]:
    """The reuse curve by tier size, and the tier's occupancy next to its size."""
    t = g.target
    bucket = s.sidecar("kvoffload_reuse_distance_bytes_bucket")
    count = s.sidecar("kvoffload_reuse_distance_bytes_count")
    return [
        g.bargauge(
            "Predicted offload hit ratio by CPU tier size",
            "From vLLM's KV events (kvoffload serve --kv-events): the share of "
            "GPU-missed prompt tokens (full blocks) a CPU tier of at most le bytes per "
            "engine would have served, for the traffic of the time range; the bounds "
            "include the current tier size and the GPU KV size "
            "(kvoffload_reuse_distance_bytes). Bars are labelled in bytes.",
            "percentunit",
            [
                t(
                    f"sum by (le) (rate({bucket}[$__rate_interval]))\n"
                    f"/ on() group_left()\n"
                    f"(sum(rate({count}[$__rate_interval])) > 0)",
                    "≤ {{le}} B",
                )
            ],
            max_value=1.0,
        ),
        g.timeseries(
            "CPU tier occupancy",
            "Bytes resident in the CPU tier from CPU BlockStored/BlockRemoved events "
            "(kvoffload_cpu_resident_bytes) next to its size: vLLM's own gauges show "
            "pinned slots, not occupancy.",
            "bytes",
            [
                t(s.sidecar("kvoffload_cpu_resident_bytes"), "{{target}} resident"),
                t(s.sidecar("kvoffload_cpu_capacity_bytes"), "{{target}} size"),
            ],
            min_value=0,
        ),
    ]


def _event_charts(s: PanelQueries) -> list[Any]:
    """The exact never-loaded bytes, and the health of the event stream."""
    cfg, t = s.cfg, g.target
    events_scope = ", ".join(
        ([cfg.sidecar_selector] if cfg.sidecar_selector else [])
        + [f'{cfg.sidecar_target_label}=~"$instance"']
    )
    return [
        g.timeseries(
            "Stored, evicted, never loaded (exact)",
            f"{sidecar_help('kvoffload_never_loaded_evicted_bytes')} Per second "
            "(kvoffload_never_loaded_evicted_bytes_total). With the bytes still resident "
            "and never loaded (kvoffload_never_loaded_resident_bytes) it is the exact "
            f"figure that stored − loaded ({record_name('wasted_bytes', cfg)}) bounds from "
            "below.",
            "Bps",
            [
                t(
                    f"sum by ({cfg.sidecar_target_label}) (rate("
                    f"{s.sidecar('kvoffload_never_loaded_evicted_bytes_total')}"
                    f"[$__rate_interval]))",
                    "{{target}}",
                )
            ],
            min_value=0,
        ),
        g.timeseries(
            "KV-event messages",
            "Messages received and lost (sequence gaps not replayed) per second "
            "(kvoffload_kv_events_messages_total, kvoffload_kv_events_lost_messages_"
            "total): lost messages make the curve optimistic.",
            "ops",
            [
                t(
                    f"sum by ({cfg.sidecar_target_label}) (rate("
                    f"kvoffload_kv_events_messages_total{{{events_scope}}}"
                    f"[$__rate_interval]))",
                    "{{target}} received",
                ),
                t(
                    f"sum by ({cfg.sidecar_target_label}) (rate("
                    f"kvoffload_kv_events_lost_messages_total{{{events_scope}}}"
                    f"[$__rate_interval]))",
                    "{{target}} lost",
                ),
            ],
            min_value=0,
        ),
    ]
