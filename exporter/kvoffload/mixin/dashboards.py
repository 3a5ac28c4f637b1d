"""The Grafana dashboards: an overview per model/engine and a fleet view across instances.

Panels read the recording rules of rules.py wherever one exists (so the dashboard, the alerts
and the sidecar show the same figure), the sidecar's gauges for what PromQL cannot compute
(capacities, the recommendation), and raw vLLM series only for per-engine views, with
`$__rate_interval`. One scope selector per source is injected into every query, like vLLM's
own generator (vLLM's `tools/generate_grafana_dashboards.py`).
"""

from __future__ import annotations

from typing import Any

from kvoffload.analysis.advisor import Thresholds
from kvoffload.analysis.formula import counter_series
from kvoffload.mixin import grafana as g
from kvoffload.mixin.promql import MixinConfig, helper_record, record_name

_ADVISOR_HORIZON = Thresholds().reuse_horizon_seconds

OVERVIEW = "overview"
FLEET = "fleet"

_VLLM_SCOPE = 'job=~"$job", instance=~"$instance", model_name=~"$model_name"'


class Scope:
    """Selectors of one dashboard: recording rules, raw vLLM series, the sidecar's series."""

    def __init__(self, cfg: MixinConfig, per_engine: bool) -> None:
        self.cfg = cfg
        self.per_engine = per_engine

    def rule(self, key: str, which: str | None = None) -> str:
        return f"{record_name(key, self.cfg, which)}{{{_VLLM_SCOPE}}}"

    def helper(self, metric: str, op: str, *matchers: str, which: str = "fast") -> str:
        scope = ", ".join([_VLLM_SCOPE, *matchers])
        return f"{helper_record(metric, op, self.cfg, which)}{{{scope}}}"

    def raw(self, name: str, *matchers: str) -> str:
        parts = [f'__name__=~"vllm[:_]{name}"', _VLLM_SCOPE]
        if self.per_engine:
            parts.append('engine=~"$engine"')
        return "{" + ", ".join([*parts, *matchers]) + "}"

    def sidecar(self, name: str, *matchers: str) -> str:
        parts = [self.cfg.sidecar_selector] if self.cfg.sidecar_selector else []
        parts += [f'{self.cfg.sidecar_target_label}=~"$instance"', 'model_name=~"$model_name"']
        return f"{name}{{{', '.join([*parts, *matchers])}}}"

    def offload_rate(self, direction: str, by: str) -> str:
        """Per-engine transfer traffic from the raw counters, in the catalog's order of
        preference (flat names, else the deprecated mirror)."""
        return "\nor\n".join(
            f"sum by ({by}) (rate({self.raw(name, *matchers)}[$__rate_interval]))"
            for name, matchers in counter_series((f"{direction}_bytes",))
        )


def _variables(cfg: MixinConfig, per_engine: bool) -> list[Any]:
    series = "vllm[:_]prompt_tokens_total"
    base = f'__name__=~"{series}"' + (f", {cfg.vllm_selector}" if cfg.vllm_selector else "")
    variables = [
        g.datasource_variable(),
        g.query_variable("job", f"label_values({{{base}}}, job)"),
        g.query_variable("instance", f'label_values({{{base}, job=~"$job"}}, instance)'),
        g.query_variable(
            "model_name",
            f'label_values({{{base}, job=~"$job", instance=~"$instance"}}, model_name)',
            label="Model",
        ),
    ]
    if per_engine:
        variables.append(
            g.query_variable(
                "engine",
                f'label_values({{{base}, job=~"$job", instance=~"$instance", '
                f'model_name=~"$model_name"}}, engine)',
            )
        )
    return variables


def _gbps(cfg: MixinConfig) -> str:
    return f"{cfg.link_peak_bytes_per_second / 1e9:g} GB/s"


def overview(cfg: MixinConfig) -> dict[str, Any]:
    s = Scope(cfg, per_engine=True)
    t = g.target
    fast, slow = cfg.rate_window, cfg.slow_window
    rec_action = f"max by (action) ({s.sidecar('kvoffload_recommendation')}) == 1"
    advice = [
        g.stat(
            "Recommendation",
            "The sidecar's current advice for the selected engines (kvoffload_recommendation"
            "): enable, leave_off, keep, grow, shrink, store_threshold or disable. Its "
            "reasons are on the sidecar's status page and in /api/v1/status.",
            "none",
            [t(rec_action, "{{action}}")],
            text_mode="name",
        ),
        g.stat(
            "Recommended --kv-offloading-size",
            "The size to pass to --kv-offloading-size when the advice carries one "
            "(kvoffload_recommended_size_bytes): per engine, total across its TP ranks.",
            "bytes",
            [t(f"max({s.sidecar('kvoffload_recommended_size_bytes')})")],
        ),
        g.stat(
            "CPU tier now",
            "Size of the CPU offload tier (pinned host memory) from vLLM's config info, "
            "summed over engines (kvoffload_cpu_capacity_bytes).",
            "bytes",
            [t(f"max({s.sidecar('kvoffload_cpu_capacity_bytes')})")],
        ),
        g.stat(
            "Offload hit ratio",
            f"Share of GPU-missed prompt tokens served from the CPU tier over {fast} "
            f"({record_name('offload_hit_ratio', cfg)}).",
            "percentunit",
            [t(f"avg({s.rule('offload_hit_ratio')})")],
            decimals=1,
        ),
        g.stat(
            "Reload speedup",
            "Load tokens/s over recompute tokens/s: a throughput ratio, not the TTFT gain "
            f"({record_name('speedup', cfg)}). Red under {cfg.min_speedup:g}; whether the tier "
            "pays is the TTFT verdict's question, not this ratio's.",
            "none",
            [t(f"avg({s.rule('speedup')})")],
            decimals=1,
            thresholds=[(0.0, "red"), (cfg.min_speedup, "green")],
        ),
        g.stat(
            f"Reuse ratio ({slow})",
            f"Bytes loaded back per byte stored over {slow} "
            f"({record_name('reuse_ratio', cfg)}). Near 0 for longer than the tier's fill "
            "time: offloading is pure cost.",
            "percentunit",
            [t(f"avg({s.rule('reuse_ratio')})")],
            decimals=1,
            thresholds=[(0.0, "red"), (cfg.low_reuse_ratio, "green")],
        ),
    ]
    effect = "kvoffload_offload_ttft_effect_seconds"
    estimate = 'bound="estimate"'
    verdict = [
        g.stat(
            "TTFT effect of the CPU tier",
            "Mean time-to-first-token change per request that the CPU tier causes now "
            "versus recomputing, as the sidecar measures it (kvoffload_offload_ttft_effect"
            "_seconds): a reload's wait, the offload path's cost and the recompute it saves. "
            "Negative = faster; red = the tier costs TTFT (KVOffloadSlowerThanRecompute).",
            "s",
            [t(f"max({s.sidecar(effect, estimate)})")],
            decimals=3,
            width=6,
            thresholds=[(0.0, "red")],
        ),
        g.stat(
            "TTFT change if the advice is applied",
            "Predicted mean TTFT change per request if the recommendation is applied, "
            "relative to now (kvoffload_recommended_ttft_change_seconds; basis measured, "
            "predicted or fleet). Empty for keep / leave_off.",
            "s",
            [
                t(
                    f"max by (basis) ("
                    f"{s.sidecar('kvoffload_recommended_ttft_change_seconds', estimate)})",
                    "{{basis}}",
                )
            ],
            decimals=3,
            width=6,
        ),
        g.timeseries(
            "TTFT effect of the CPU tier, with its range",
            "The sidecar's measured TTFT effect (estimate, low, high): the verdict "
            "keeps a tier only when the whole range is a saving of at least 5 ms and "
            "5% of the mean TTFT (docs/advisor.md).",
            "s",
            [
                t(
                    f"max by ({cfg.sidecar_target_label}, bound) ({s.sidecar(effect)})",
                    "{{target}} {{bound}}",
                )
            ],
            width=12,
            height=5,
        ),
    ]
    paying = [
        g.timeseries(
            "Prompt tokens served from cache",
            "Offload hit ratio (GPU-missed tokens served from the CPU tier) next to "
            "the GPU prefix hit ratio (looked-up tokens found on the GPU), "
            f"over {fast}.",
            "percentunit",
            [
                t(s.rule("offload_hit_ratio"), "{{instance}} CPU tier"),
                t(s.rule("gpu_prefix_hit_ratio"), "{{instance}} GPU prefix cache"),
            ],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "Where prompt tokens come from",
            "Share of prompt tokens computed, hit in the GPU prefix cache, or supplied "
            "by a KV connector (the CPU tier, or another connector) "
            f"(vllm:prompt_tokens_by_source over {fast}).",
            "percentunit",
            [t(s.rule("prompt_share_local_compute"), "{{instance}} {{source}}")],
            stack=True,
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "Time to first token",
            f"TTFT quantiles and mean over {fast}. A reload's copy lands in queue "
            "time (one more engine step), so compare with and without offloading.",
            "s",
            [
                *(
                    t(
                        s.helper(
                            "vllm_time_to_first_token_seconds",
                            "histogram_quantile_rate",
                            f'quantile="{q}"',
                        ),
                        f"{{{{instance}}}} p{float(q) * 100:g}",
                    )
                    for q in ("0.5", "0.9", "0.99")
                ),
                t(s.rule("mean_ttft_seconds"), "{{instance}} mean"),
            ],
        ),
        g.timeseries(
            "Reload vs recompute",
            "Tokens restored from the CPU tier per second of copy time (× world "
            f"size {cfg.world_size}) next to prefill tokens computed per second of "
            "prefill time.",
            "short",
            [
                t(s.rule("load_tokens_per_second"), "{{instance}} reload"),
                t(s.rule("recompute_tokens_per_second"), "{{instance}} recompute"),
            ],
        ),
    ]
    cost = [
        g.timeseries(
            "Offload traffic",
            f"Wall-clock bytes per second stored into and loaded from the CPU tier "
            f"over {fast}, all workers.",
            "Bps",
            [
                t(s.rule("store_rate_bytes_per_second"), "{{instance}} store"),
                t(s.helper("vllm_kv_offload_load_bytes", "rate"), "{{instance}} load"),
            ],
        ),
        g.timeseries(
            f"Stored but not loaded back ({slow})",
            f"Bytes stored minus bytes loaded over {slow}, floored at 0: an "
            "upper-bound proxy for offloaded KV never reused (counters cannot tell "
            "which blocks came back).",
            "bytes",
            [
                t(s.rule("wasted_bytes"), "{{instance}} not loaded back"),
                t(s.rule("stored_bytes"), "{{instance}} stored"),
                t(s.rule("loaded_bytes"), "{{instance}} loaded"),
            ],
        ),
        g.timeseries(
            f"Reuse ratio ({slow})",
            f"Bytes loaded back per byte stored over {slow}; can exceed 100% when hot "
            "blocks are reloaded repeatedly.",
            "percentunit",
            [t(s.rule("reuse_ratio"), "{{instance}}")],
            min_value=0,
            lines=[(cfg.low_reuse_ratio, "red")],
        ),
        g.timeseries(
            "Queue time and TTFT",
            "Mean queue time (asynchronous offload loads wait here) and mean time to "
            f"first token over {fast}.",
            "s",
            [
                t(s.rule("mean_queue_seconds"), "{{instance}} queue"),
                t(s.rule("mean_ttft_seconds"), "{{instance}} TTFT"),
            ],
        ),
    ]
    transfers = [
        g.timeseries(
            "Copy bandwidth per worker",
            "Bytes per second of copy time (vLLM adds the times of all ranks: this is "
            f"per worker). Dashed: the {_gbps(cfg)} nominal link peak and the "
            f"{cfg.transfer_slow_bytes_per_second / 1e9:g} GB/s floor of "
            "KVOffloadTransferSlow.",
            "Bps",
            [
                t(s.rule("load_gbps"), "{{instance}} load (CPU→GPU)"),
                t(s.rule("store_gbps"), "{{instance}} store (GPU→CPU)"),
            ],
            min_value=0,
            lines=[
                (cfg.transfer_slow_bytes_per_second, "orange"),
                (cfg.link_peak_bytes_per_second, "red"),
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
            "ops",
            [t(s.rule("allocation_failures_per_second"), "{{instance}}")],
            min_value=0,
        ),
    ]
    capacity = [
        g.timeseries(
            "KV capacity in tokens",
            "Tokens the CPU tier and the GPU KV cache hold, from vLLM's config info "
            "(computed by the sidecar: PromQL cannot read numbers from labels). The "
            "CPU tier must be larger than the GPU cache to add hits.",
            "short",
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
            "s",
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
        g.timeseries(
            "How long a prefix survives on the GPU",
            "GPU KV capacity over the rate of prompt tokens written into it (computed "
            f"or loaded, {fast}): reuse gaps longer than this need the CPU tier. "
            f"Dashed: the advisor's {_ADVISOR_HORIZON:g} s reuse horizon.",
            "s",
            [t(s.rule("gpu_turnover_seconds"), "{{instance}}")],
            min_value=0,
            lines=[(_ADVISOR_HORIZON, "orange")],
        ),
        g.timeseries(
            "CPU tier filled since start",
            "Bytes stored since the engines started over the CPU tier's size: below "
            "100% the tier has never been full, so it cannot have evicted anything.",
            "percentunit",
            [t(s.rule("cpu_fill_ratio_since_start"), "{{instance}}")],
            min_value=0,
            lines=[(1.0, "orange")],
        ),
        g.timeseries(
            "Preemptions",
            f"Request preemptions per second over {fast}: the GPU KV cache ran out.",
            "ops",
            [t(s.rule("preemptions_per_second"), "{{instance}}")],
            min_value=0,
            width=6,
        ),
        g.timeseries(
            "Waiting for KV capacity",
            f"Mean number of requests waiting for KV cache capacity over {fast}.",
            "short",
            [t(s.rule("waiting_for_capacity"), "{{instance}}")],
            min_value=0,
            width=6,
        ),
    ]
    bucket = s.sidecar("kvoffload_reuse_distance_bytes_bucket")
    count = s.sidecar("kvoffload_reuse_distance_bytes_count")
    events_scope = ", ".join(
        ([cfg.sidecar_selector] if cfg.sidecar_selector else [])
        + [f'{cfg.sidecar_target_label}=~"$instance"']
    )
    exact = [
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
            height=10,
        ),
        g.stat(
            "Achievable offload hit ratio",
            "What an unbounded CPU tier would serve, from the KV-event curve "
            "(kvoffload_achievable_offload_hit_ratio).",
            "percentunit",
            [t(f"max({s.sidecar('kvoffload_achievable_offload_hit_ratio')})")],
            decimals=1,
            width=4,
            height=5,
        ),
        g.stat(
            "Predicted at the advised size",
            "Offload hit ratio the curve predicts at the recommended size, else at the "
            "current one (kvoffload_predicted_offload_hit_ratio).",
            "percentunit",
            [t(f"max({s.sidecar('kvoffload_predicted_offload_hit_ratio')})")],
            decimals=1,
            width=4,
            height=5,
        ),
        g.stat(
            "Predicted TTFT effect at the advised size",
            "Mean TTFT change per request a CPU tier of the advised size would cause "
            "against none, predicted from the curve and this engine's measured costs "
            "(kvoffload_predicted_offload_ttft_effect_seconds); negative = faster.",
            "s",
            [t(f"max({s.sidecar('kvoffload_predicted_offload_ttft_effect_seconds')})")],
            decimals=3,
            width=4,
            height=5,
            thresholds=[(0.0, "red")],
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
            width=12,
        ),
        g.timeseries(
            "Stored, evicted, never loaded (exact)",
            "Bytes per second evicted from the CPU tier without ever being loaded "
            "back, from KV events (kvoffload_never_loaded_evicted_bytes_total): the "
            "exact waste that stored − loaded only bounds.",
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
            width=6,
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
            width=6,
        ),
    ]
    return g.dashboard(
        title=f"{cfg.dashboard_title_prefix}Overview",
        uid=f"{cfg.dashboard_uid_prefix}-{OVERVIEW}",
        description="Is vLLM's CPU KV offloading paying off, what does it cost, is the CPU tier "
        "the right size, and should it be on? Generated by kvoffload.",
        tags=cfg.dashboard_tags,
        sections=[
            ("Advice", advice),
            ("Time to first token: the verdict", verdict),
            ("Is offloading paying off?", paying),
            ("What does it cost?", cost),
            ("Transfers", transfers),
            ("Capacity", capacity),
            ("Exact sizing (KV events)", exact),
        ],
        variables=_variables(cfg, per_engine=True),
        refresh=cfg.dashboard_refresh,
        time_from=cfg.dashboard_time_from,
        links=_links(cfg),
    )


def fleet(cfg: MixinConfig) -> dict[str, Any]:
    s = Scope(cfg, per_engine=False)
    t = g.target
    fast, slow = cfg.rate_window, cfg.slow_window
    by = "instance, model_name"
    columns = [
        ("offload_hit_ratio", "Offload hit ratio", "percentunit"),
        ("gpu_prefix_hit_ratio", "GPU prefix hit ratio", "percentunit"),
        ("reuse_ratio", f"Reuse ratio ({slow})", "percentunit"),
        ("load_gbps", "Load bandwidth", "Bps"),
        ("speedup", "Reload speedup", "none"),
        ("cpu_fill_seconds", "CPU tier fill time", "s"),
        ("store_rate_bytes_per_second", "Store rate", "Bps"),
    ]
    targets = [
        t(f"max by ({by}) ({s.rule(key)})", instant=True, table=True)
        for key, _header, _unit in columns
    ]
    overview_table = g.table(
        "Engines at a glance",
        "One row per instance and model: the current figures (recording rules, "
        f"{fast}/{slow} windows). Blank: undefined (no traffic, or offloading off).",
        targets,
        [(chr(ord("A") + i), header, unit) for i, (_key, header, unit) in enumerate(columns)],
    )
    advice = g.timeseries(
        "Recommendations across the fleet",
        "How many engines get each advice from their sidecar (kvoffload_recommendation).",
        "short",
        [t(f"count by (action) ({s.sidecar('kvoffload_recommendation')} == 1)", "{{action}}")],
        stack=True,
        min_value=0,
    )
    model = 'model_name=~"$model_name"'
    mean = helper_record("vllm_time_to_first_token_seconds", "fleet_mean_rate", cfg, "slow")
    effect = helper_record("kvoffload_offload_ttft_effect_seconds", "fleet_rate", cfg, "slow")
    ab = [
        g.timeseries(
            "Mean TTFT, replicas with and without a CPU tier",
            f"Mean time to first token per model over {slow}, over its replicas with "
            f"offloading and over those without ({mean}): where a fleet runs both, "
            "the measured A/B. Load is not matched: compare the request rates.",
            "s",
            [t(f"{mean}{{{model}}}", "{{model_name}} offloading {{offloading}}")],
        ),
        g.timeseries(
            "TTFT effect of offloading across the fleet",
            f"Mean TTFT with a tier minus without, per model, over {slow} ({effect}); "
            "negative = the tier makes TTFT better. The sidecar's fleet A/B "
            "(basis fleet) also matches load before comparing.",
            "s",
            [t(f"{effect}{{{model}}}", "{{model_name}}")],
            lines=[(0.0, "red")],
        ),
    ]
    per_instance = [
        g.timeseries(
            "TTFT effect of the CPU tier by instance",
            "Mean TTFT change per request the CPU tier causes versus recomputing, "
            "as each sidecar measures it (kvoffload_offload_ttft_effect_seconds); "
            "above 0 the tier costs TTFT.",
            "s",
            [
                t(
                    s.sidecar("kvoffload_offload_ttft_effect_seconds", 'bound="estimate"'),
                    "{{target}} {{model_name}}",
                )
            ],
            lines=[(0.0, "red")],
        ),
        g.timeseries(
            "Offload hit ratio by instance",
            f"Share of GPU-missed prompt tokens served from the CPU tier ({fast}).",
            "percentunit",
            [t(s.rule("offload_hit_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "GPU prefix hit ratio by instance",
            f"Share of looked-up prompt tokens found in the GPU prefix cache ({fast}).",
            "percentunit",
            [t(s.rule("gpu_prefix_hit_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "Store rate by instance",
            f"Bytes per second stored into the CPU tier ({fast}).",
            "Bps",
            [t(s.rule("store_rate_bytes_per_second"), "{{instance}} {{model_name}}")],
            min_value=0,
        ),
        g.timeseries(
            f"Reuse ratio by instance ({slow})",
            f"Bytes loaded back per byte stored ({slow}).",
            "percentunit",
            [t(s.rule("reuse_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            lines=[(cfg.low_reuse_ratio, "red")],
        ),
        g.timeseries(
            "Load bandwidth by instance",
            f"CPU→GPU bytes per second of copy time, per worker ({fast}); dashed: the "
            f"{_gbps(cfg)} nominal link peak.",
            "Bps",
            [t(s.rule("load_gbps"), "{{instance}} {{model_name}}")],
            min_value=0,
            lines=[(cfg.link_peak_bytes_per_second, "red")],
        ),
        g.timeseries(
            "GPU KV cache usage by instance",
            f"Mean share of GPU KV blocks held by running requests ({fast}).",
            "percentunit",
            [t(s.rule("gpu_kv_usage_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
        ),
    ]
    return g.dashboard(
        title=f"{cfg.dashboard_title_prefix}Fleet",
        uid=f"{cfg.dashboard_uid_prefix}-{FLEET}",
        description="KV offloading across every vLLM instance: who benefits, who pays, who "
        "should change. Generated by kvoffload.",
        tags=cfg.dashboard_tags,
        sections=[
            ("Fleet", [overview_table, advice]),
            ("Fleet A/B: with and without a tier", ab),
            ("By instance", per_instance),
        ],
        variables=_variables(cfg, per_engine=False),
        refresh=cfg.dashboard_refresh,
        time_from=cfg.dashboard_time_from,
        links=_links(cfg),
    )


def _links(cfg: MixinConfig) -> list[dict[str, Any]]:
    return [
        {
            "title": "kvoffload",
            "type": "dashboards",
            "tags": [cfg.dashboard_tags[0]],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
        }
    ]


def render(cfg: MixinConfig) -> dict[str, str]:
    """Relative path → JSON text of every dashboard, import and provisioning variants."""
    out: dict[str, str] = {}
    for name, build in ((OVERVIEW, overview), (FLEET, fleet)):
        d = build(cfg)
        types = [p["type"] for p in d["panels"] if p["type"] != "row"]
        out[f"import/kvoffload-{name}.json"] = g.to_json(g.for_import(d, types))
        out[f"provisioning/kvoffload-{name}.json"] = g.to_json(g.for_provisioning(d))
    return out
