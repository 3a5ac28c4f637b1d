"""The Grafana dashboards: an overview per model/engine and a fleet view across instances.

Panels read the recording rules of rules.py wherever one exists (so the dashboard, the alerts
and the sidecar show the same figure), the sidecar's gauges for what PromQL cannot compute
(capacities, the recommendation), and raw vLLM series only for per-engine views, with
`$__rate_interval`. One scope selector per source is injected into every query, like vLLM's
own generator (vLLM's `tools/generate_grafana_dashboards.py`): a variable and a filter for each
of the config's `target_labels` (the labels the rules group by), `model_name`, and `engine` on
the per-engine views. The variables list vLLM's own series (`label_values()` of a gauge every
vLLM serves, under both spellings, narrowed by the rules' vLLM selector), so the dropdowns work on
a Prometheus that has not loaded kvoffload's rules: importing a dashboard is the usual first step.

On a Prometheus without kvoffload's rules (import-only, the usual first step) a panel reads
`rule or <the rule's own PromQL over vLLM's series>`, so it still shows the same figure; a panel
whose rule cannot be written that way says "Needs kvoffload's recording rules" in its
description, and a text panel on top lists them.

A panel showing one catalog figure takes its unit and its description from the catalog
(`signals.FIGURES`: the unit, and the help text /metrics and docs/metrics.md also print), so the
dashboards say what the sidecar and the docs say.
"""

from __future__ import annotations

import re
from typing import Any

from kvoffload.analysis.formula import GATE_RECORD, counter_series
from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.links import doc
from kvoffload.mixin import grafana as g
from kvoffload.mixin.promql import (
    RENDERINGS,
    MixinConfig,
    Rendering,
    helper_record,
    offload_configured,
    record_name,
    rendering_for,
)
from kvoffload.sidecar.metrics import (
    ADVICE_METRICS,
    HOST_MEMORY_METRICS,
    KV_EVENT_METRICS,
    TTFT_METRICS,
)
from kvoffload.thresholds import Thresholds

_ADVISOR_HORIZON = Thresholds().reuse_horizon_seconds

OVERVIEW = "overview"
FLEET = "fleet"
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
}

# The variables list the targets from a gauge every vLLM engine serves from its start (0.6 to
# 0.26 and the simulator), labelled model_name and engine; not from a recording rule, so they
# also fill on a Prometheus without kvoffload's rules.
_TARGETS_SERIES = "num_requests_running"


# A recording rule's name (level:metric:operation); `vllm[:_]name` selectors do not match.
RULE_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")
# What the description of a panel that reads a rule with no raw fallback says.
NEEDS_RULES = "Needs kvoffload's recording rules"
NEEDS_RULES_TITLE = "Panels that need kvoffload's recording rules"


def raw_expr(r: Rendering, cfg: MixinConfig, which: str | None, scope: str = "") -> str | None:
    """The rule's own PromQL (what Prometheus evaluates to record it) with `scope` added to
    its vLLM selectors, and its static labels; None where it reads another recording rule and
    so cannot stand in for it. The offload gate, a rule of raw series itself, is inlined
    (unscoped: vLLM's config info has no model_name)."""
    if not cfg.dashboard_raw_fallback:
        return None
    expr = r.build(cfg, r.window(cfg, which) if which else "")
    if scope:
        expr = re.sub(r'\{__name__=~"vllm\[:_\][^"]*"', lambda m: f"{m.group(0)}, {scope}", expr)
    expr = expr.replace(GATE_RECORD, f"(\n{offload_configured(cfg)}\n)")
    if RULE_NAME.search(expr):
        return None
    for label, value in r.labels:
        expr = f'label_replace({expr}, "{label}", "{value}", "", "")'
    return expr


def fallback_rules(cfg: MixinConfig) -> set[str]:
    """Recording rules a panel reads as `rule or raw`: it shows data without the rules."""
    return {
        r.record(cfg, w)
        for r in RENDERINGS
        for w in r.windows or (None,)
        if raw_expr(r, cfg, w) is not None
    }


def needs_rules(expr: str, cfg: MixinConfig) -> list[str]:
    """The recording rules `expr` reads that have no raw fallback."""
    fallback = fallback_rules(cfg)
    return sorted({n for n in RULE_NAME.findall(expr) if n not in fallback})


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


def _scope(cfg: MixinConfig) -> str:
    """Matchers of the dashboard variables on the target labels and model_name."""
    return ", ".join(
        [*(f'{label}=~"${label}"' for label in cfg.target_labels), 'model_name=~"$model_name"']
    )


class Scope:
    """Selectors of one dashboard: recording rules, raw vLLM series, the sidecar's series."""

    def __init__(self, cfg: MixinConfig, per_engine: bool) -> None:
        self.cfg = cfg
        self.per_engine = per_engine
        self.scope = _scope(cfg)

    def rule(self, key: str, which: str | None = None) -> str:
        r = rendering_for(key)
        return self._or_raw(r, which or (r.windows[0] if r.windows else None))

    def helper(self, metric: str, op: str, *matchers: str, which: str = "fast") -> str:
        # Renderings of one name differ in their static labels (the quantile): the matchers pick.
        for r in RENDERINGS:
            labels = {f'{k}="{v}"' for k, v in r.labels}
            if r.metric == metric and r.op == op and which in r.windows and labels <= set(matchers):
                return self._or_raw(r, which, *matchers)
        raise KeyError((metric, op, which))

    def _or_raw(
        self, r: Rendering, which: str | None, *matchers: str, scope: str | None = None
    ) -> str:
        """The rule, else (no rules loaded) its own expression over the raw series, scoped by
        the variables: on a Prometheus without kvoffload's rules the panel still shows it.
        With the rules both sides hold the same label sets, so `or` adds nothing."""
        scope = self.scope if scope is None else scope
        rule = f"{r.record(self.cfg, which)}{{{', '.join([scope, *matchers])}}}"
        raw = raw_expr(r, self.cfg, which, scope)
        return rule if raw is None else f"(\n{rule}\nor\n{raw}\n)"

    def fleet_mean(self, metric: str, op: str, which: str) -> str:
        """A per-model fleet rule (no target labels; one rendering per static label set, e.g.
        with and without a tier) scoped by the model alone, else all its renderings raw."""
        scope = 'model_name=~"$model_name"'
        family = [r for r in RENDERINGS if r.metric == metric and r.op == op]
        rule = f"{family[0].record(self.cfg, which)}{{{scope}}}"
        raws = [raw_expr(r, self.cfg, which, scope) for r in family]
        if any(raw is None for raw in raws):
            return rule
        return "(\n" + "\nor\n".join([rule, *(str(raw) for raw in raws)]) + "\n)"

    def fleet_effect(self) -> str:
        """The fleet A/B difference (with a tier minus without), else from the raw means: its
        rule reads the mean rules, so its own expression cannot stand in for it."""
        scope = 'model_name=~"$model_name"'
        rule = helper_record(
            "kvoffload_offload_ttft_effect_seconds", "fleet_rate", self.cfg, "slow"
        )
        on, off = (
            raw_expr(r, self.cfg, "slow", scope)
            for r in RENDERINGS
            if r.metric == "vllm_time_to_first_token_seconds" and r.op == "fleet_mean_rate"
        )
        if on is None or off is None:
            return f"{rule}{{{scope}}}"
        assert 'offloading", "on"' in on
        return f"(\n{rule}{{{scope}}}\nor\n(\n{on}\n- ignoring (offloading)\n{off}\n)\n)"

    def raw(self, name: str, *matchers: str) -> str:
        """Raw vLLM series: the rules' selector too (the variables' "All" is `.+`)."""
        parts = [f'__name__=~"vllm[:_]{name}"']
        if self.cfg.vllm_selector:
            parts.append(self.cfg.vllm_selector)
        parts.append(self.scope)
        if self.per_engine:
            parts.append('engine=~"$engine"')
        return "{" + ", ".join([*parts, *matchers]) + "}"

    def raw_info(self, name: str) -> str:
        """vLLM's info gauges: no model_name label, so only the target labels and engine."""
        parts = [f'__name__=~"vllm[:_]{name}"']
        if self.cfg.vllm_selector:
            parts.append(self.cfg.vllm_selector)
        parts += [f'{label}=~"${label}"' for label in self.cfg.target_labels]
        if self.per_engine:
            parts.append('engine=~"$engine"')
        return "{" + ", ".join(parts) + "}"

    def labelled(self, label: str, parts: dict[str, str]) -> str:
        """Several queries as one, each tagged by `label`: one series set, one legend, and
        data as soon as any part has some."""
        return "\nor\n".join(
            f'label_replace({expr}, "{label}", "{value}", "", "")' for value, expr in parts.items()
        )

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
    """One variable per target label, then model_name (and engine), each narrowed by those
    before it; listed from vLLM's own gauge under both spellings (vllm: and vllm_)."""
    variables = [g.datasource_variable()]
    before = [f'__name__=~"vllm[:_]{_TARGETS_SERIES}"']
    if cfg.vllm_selector:
        before.append(cfg.vllm_selector)
    labels = (*cfg.target_labels, "model_name", *(("engine",) if per_engine else ()))
    for label in labels:
        variables.append(
            g.query_variable(
                label,
                f"label_values({{{', '.join(before)}}}, {label})",
                label="Model" if label == "model_name" else None,
            )
        )
        before.append(f'{label}=~"${label}"')
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
            about(cfg, "offload_hit_ratio"),
            unit("offload_hit_ratio"),
            [t(f"avg({s.rule('offload_hit_ratio')})")],
            decimals=1,
        ),
        g.stat(
            "Reload speedup",
            about(
                cfg,
                "speedup",
                f"Red under {cfg.min_speedup:g}×; whether the tier pays is the TTFT verdict's "
                "question, not this ratio's.",
            ),
            unit("speedup"),
            [t(f"avg({s.rule('speedup')})")],
            decimals=1,
            thresholds=[(0.0, "red"), (cfg.min_speedup, "green")],
        ),
        g.stat(
            f"Reuse ratio ({slow})",
            about(
                cfg,
                "reuse_ratio",
                "Near 0 for longer than the tier's fill time: offloading is pure cost.",
            ),
            unit("reuse_ratio"),
            [t(f"avg({s.rule('reuse_ratio')})")],
            decimals=2,
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
            f"5% of the mean TTFT ([the verdict]({doc('advisor.md')})).",
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
            unit("offload_hit_ratio"),
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
            unit("prompt_share_local_compute"),
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
            unit("load_tokens_per_second"),
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
            unit("store_rate_bytes_per_second"),
            [
                t(s.rule("store_rate_bytes_per_second"), "{{instance}} store"),
                t(s.helper("vllm_kv_offload_load_bytes", "rate"), "{{instance}} load"),
            ],
        ),
        g.timeseries(
            f"Stored but not loaded back ({slow})",
            about(
                cfg,
                "wasted_bytes",
                "Counters cannot tell which blocks came back; the exact figure is in the row "
                f'"{EXACT_ROW}".',
            ),
            unit("wasted_bytes"),
            [
                t(s.rule("wasted_bytes"), "{{instance}} not loaded back"),
                t(s.rule("stored_bytes"), "{{instance}} stored"),
                t(s.rule("loaded_bytes"), "{{instance}} loaded"),
            ],
        ),
        g.timeseries(
            f"Reuse ratio ({slow})",
            about(cfg, "reuse_ratio", "Above 1× when hot blocks are reloaded repeatedly."),
            unit("reuse_ratio"),
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
    # The TTFT model's parts that are closed formulas of rates, each its own recording rule
    # (docs/advisor.md, "What Prometheus alone shows"); the verdict itself is the sidecar's.
    parts = [
        g.timeseries(
            "Where queue time goes",
            f"Mean queue time over {fast}, split by Little's law into the wait for KV "
            "capacity (mean requests waiting for capacity ÷ request rate; a server "
            "without a tier has it too) and the rest, which on a server with a CPU tier is "
            f"the wait of its reloads. Rules: {record_name('mean_queue_seconds', cfg)}, "
            f"{record_name('capacity_queue_seconds', cfg)}, "
            f"{record_name('reload_wait_seconds', cfg)}.",
            "s",
            [
                t(s.rule("mean_queue_seconds"), "{{instance}} queue"),
                t(s.rule("capacity_queue_seconds"), "{{instance}} waiting for capacity"),
                t(s.rule("reload_wait_seconds"), "{{instance}} reload wait"),
            ],
            min_value=0,
        ),
        g.timeseries(
            "Prefill and copy time",
            f"Mean prefill time per request (first scheduled to first token) and the copy "
            f"time of one CPU-to-GPU load job per worker, over {fast}: a reload waits 2–10× "
            f"its copy. Rules: {record_name('mean_prefill_seconds', cfg)}, "
            f"{record_name('load_copy_seconds', cfg)}.",
            "s",
            [
                t(s.rule("mean_prefill_seconds"), "{{instance}} prefill"),
                t(s.rule("load_copy_seconds"), "{{instance}} copy per load"),
            ],
            min_value=0,
        ),
        g.timeseries(
            "Reloaded tokens per request",
            about(cfg, "reloaded_tokens_per_request"),
            unit("reloaded_tokens_per_request"),
            [t(s.rule("reloaded_tokens_per_request"), "{{instance}}")],
            min_value=0,
            width=8,
        ),
        g.timeseries(
            "Loads per request",
            about(cfg, "loads_per_request"),
            unit("loads_per_request"),
            [t(s.rule("loads_per_request"), "{{instance}}")],
            min_value=0,
            width=8,
        ),
        g.timeseries(
            "Requests in the engine",
            about(
                cfg,
                "requests_in_system",
                "Near 1 a reload waits alone (its copy + a scheduling pass); from 2 up, "
                "about one prefill time (the verdict blends the two in between).",
            ),
            unit("requests_in_system"),
            [t(s.rule("requests_in_system"), "{{instance}}")],
            min_value=0,
            width=8,
        ),
    ]
    transfers = [
        g.timeseries(
            "Copy bandwidth per worker",
            "Bytes per second of copy time (vLLM adds the times of all ranks: this is "
            f"per worker). Dashed: the {_gbps(cfg)} nominal link peak and the "
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
            unit("allocation_failures_per_second"),
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
    bucket = s.sidecar("kvoffload_reuse_distance_bytes_bucket")
    count = s.sidecar("kvoffload_reuse_distance_bytes_count")
    events_scope = ", ".join(
        ([cfg.sidecar_selector] if cfg.sidecar_selector else [])
        + [f'{cfg.sidecar_target_label}=~"$instance"']
    )
    # Three stats across, then two rows of two charts: the rectangle has no holes.
    exact = [
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
    host = _host_memory_panels(cfg)
    diagnostics = _diagnostics_panels(s)
    return g.dashboard(
        title=f"{cfg.dashboard_title_prefix}Overview",
        uid=f"{cfg.dashboard_uid_prefix}-{OVERVIEW}",
        description="Is vLLM's CPU KV offloading paying off, what does it cost, is the CPU tier "
        "the right size, and should it be on? Generated by kvoffload.",
        tags=cfg.dashboard_tags,
        sections=with_rules_note(
            cfg,
            [
                g.Section("Advice", advice),
                g.Section("Time to first token: the verdict", verdict),
                g.Section("Is offloading paying off?", paying),
                g.Section("What does it cost?", cost),
                g.Section("TTFT parts", parts),
                g.Section("Transfers", transfers),
                g.Section("Capacity", capacity),
                g.Section("Host memory", host),
                g.Section(EXACT_ROW, exact, collapsed=True),
                g.Section(DIAGNOSTICS_ROW, diagnostics, collapsed=True),
            ],
        ),
        variables=_variables(cfg, per_engine=True),
        refresh=cfg.dashboard_refresh,
        time_from=cfg.dashboard_time_from,
        links=_links(cfg),
    )


def _diagnostics_panels(s: Scope) -> list[Any]:
    """What upstream's KV-cache dashboard shows of the offloading connector, from vLLM's own
    series per engine: lookup delay, transfer sizes, pinned slots, failed and skipped stores,
    the configuration."""
    t = g.target
    by = "instance, engine"

    def rate(name: str, *matchers: str) -> str:
        return f"rate({s.raw(name, *matchers)}[$__rate_interval])"

    def quantile(q: str, name: str, *matchers: str) -> str:
        return f"histogram_quantile({q}, sum by ({by}, le) ({rate(name + '_bucket', *matchers)}))"

    lookup = {
        kind: quantile("0.99", f"kv_offload_lookup_{kind}_delay_seconds")
        for kind in ("sync", "async")
    }
    # Flat load/store histograms (0.24+), else the deprecated transfer_type mirror.
    mirror = {"load": 'transfer_type="CPU_to_GPU"', "store": 'transfer_type="GPU_to_CPU"'}
    sizes = {
        f"{direction} p{float(q) * 100:g}": (
            f"(\n{quantile(q, f'kv_offload_{direction}_size')}\nor\n"
            f"{quantile(q, 'kv_offload_size', mirror[direction])}\n)"
        )
        for direction in ("load", "store")
        for q in ("0.5", "0.99")
    }
    pinned = {
        kind: f"max by ({by}) ({s.raw(f'kv_offload_cpu_cache_{kind}_usage_perc')})"
        for kind in ("write", "read")
    }
    stores = {
        "failed": f"sum by ({by}) ({rate('kv_offload_allocation_failure_total')})",
        "skipped": f"sum by ({by}) ({rate('kv_offload_stores_skipped_total')})",
    }
    config = ", ".join(("instance", "engine", *CONFIG_LABELS))
    offload_config = ", ".join(("instance", "engine", *OFFLOAD_CONFIG_LABELS))
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


def _host_memory_panels(cfg: MixinConfig) -> list[Any]:
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


def fleet(cfg: MixinConfig) -> dict[str, Any]:
    s = Scope(cfg, per_engine=False)
    t = g.target
    fast, slow = cfg.rate_window, cfg.slow_window
    by = "instance, model_name"
    columns = [
        ("offload_hit_ratio", "Offload hit ratio"),
        ("gpu_prefix_hit_ratio", "GPU prefix hit ratio"),
        ("reuse_ratio", f"Reuse ratio ({slow})"),
        ("load_gbps", "Load bandwidth"),
        ("speedup", "Reload speedup"),
        ("cpu_fill_seconds", "CPU tier fill time"),
        ("store_rate_bytes_per_second", "Store rate"),
    ]
    targets = [
        t(f"max by ({by}) ({s.rule(key)})", instant=True, table=True) for key, _header in columns
    ]
    overview_table = g.table(
        "Engines at a glance",
        "One row per instance and model: the current figures (recording rules, "
        f"{fast}/{slow} windows). Blank: undefined (no traffic, or offloading off).",
        targets,
        [(chr(ord("A") + i), header, unit(key)) for i, (key, header) in enumerate(columns)],
    )
    advice = g.timeseries(
        "Recommendations across the fleet",
        "How many engines get each advice from their sidecar (kvoffload_recommendation).",
        "short",
        [t(f"count by (action) ({s.sidecar('kvoffload_recommendation')} == 1)", "{{action}}")],
        stack=True,
        min_value=0,
        width=24,
    )
    mean = helper_record("vllm_time_to_first_token_seconds", "fleet_mean_rate", cfg, "slow")
    effect = helper_record("kvoffload_offload_ttft_effect_seconds", "fleet_rate", cfg, "slow")
    ab = [
        g.timeseries(
            "Mean TTFT, replicas with and without a CPU tier",
            f"Mean time to first token per model over {slow}, over its replicas with "
            f"offloading and over those without ({mean}): where a fleet runs both, "
            "the measured A/B. Load is not matched: compare the request rates.",
            "s",
            [
                t(
                    s.fleet_mean("vllm_time_to_first_token_seconds", "fleet_mean_rate", "slow"),
                    "{{model_name}} offloading {{offloading}}",
                )
            ],
        ),
        g.timeseries(
            "TTFT effect of offloading across the fleet",
            f"Mean TTFT with a tier minus without, per model, over {slow} ({effect}); "
            "negative = the tier makes TTFT better. The sidecar's fleet A/B "
            "(basis fleet) also matches load before comparing.",
            "s",
            [t(s.fleet_effect(), "{{model_name}}")],
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
            about(cfg, "offload_hit_ratio"),
            unit("offload_hit_ratio"),
            [t(s.rule("offload_hit_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "GPU prefix hit ratio by instance",
            about(cfg, "gpu_prefix_hit_ratio"),
            unit("gpu_prefix_hit_ratio"),
            [t(s.rule("gpu_prefix_hit_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
        ),
        g.timeseries(
            "Store rate by instance",
            about(cfg, "store_rate_bytes_per_second"),
            unit("store_rate_bytes_per_second"),
            [t(s.rule("store_rate_bytes_per_second"), "{{instance}} {{model_name}}")],
            min_value=0,
        ),
        g.timeseries(
            f"Reuse ratio by instance ({slow})",
            about(cfg, "reuse_ratio"),
            unit("reuse_ratio"),
            [t(s.rule("reuse_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            lines=[(cfg.low_reuse_ratio, "red")],
        ),
        g.timeseries(
            "Load bandwidth by instance",
            about(cfg, "load_gbps", f"Dashed: the {_gbps(cfg)} nominal link peak."),
            unit("load_gbps"),
            [t(s.rule("load_gbps"), "{{instance}} {{model_name}}")],
            min_value=0,
            lines=[(cfg.link_peak_bytes_per_second, "red")],
        ),
        g.timeseries(
            "GPU KV cache usage by instance",
            about(cfg, "gpu_kv_usage_ratio"),
            unit("gpu_kv_usage_ratio"),
            [t(s.rule("gpu_kv_usage_ratio"), "{{instance}} {{model_name}}")],
            min_value=0,
            max_value=1,
            width=24,
        ),
    ]
    return g.dashboard(
        title=f"{cfg.dashboard_title_prefix}Fleet",
        uid=f"{cfg.dashboard_uid_prefix}-{FLEET}",
        description="KV offloading across every vLLM instance: who benefits, who pays, who "
        "should change. Generated by kvoffload.",
        tags=cfg.dashboard_tags,
        sections=with_rules_note(
            cfg,
            [
                g.Section("Fleet", [overview_table, advice]),
                g.Section("Fleet A/B: with and without a tier", ab),
                g.Section("By instance", per_instance),
            ],
        ),
        variables=_variables(cfg, per_engine=False),
        refresh=cfg.dashboard_refresh,
        time_from=cfg.dashboard_time_from,
        links=_links(cfg),
    )


def with_rules_note(cfg: MixinConfig, sections: list[g.Section]) -> list[g.Section]:
    """Mark each panel that reads a rule with no raw fallback (its description says so) and
    put a text panel listing them on top: on a Prometheus without the rules they are blank,
    and the dashboard says why."""
    listed: list[str] = []
    only_where: list[str] = []
    for section in sections:
        for panel in section.panels:
            if ONLY_WHERE in panel.body.description:
                only_where.append(f"- **{panel.body.title}** ({section.title})")
            names = sorted(
                {n for t in getattr(panel.body, "targets", []) for n in needs_rules(t.expr, cfg)}
            )
            if names:
                panel.body.description += f" {NEEDS_RULES} ({', '.join(names)})."
                listed.append(f"- **{panel.body.title}** ({section.title}): {', '.join(names)}")
    intro = (
        "Panels read kvoffload's recording rules (`alerts/kvoffload-rules.yaml`, "
        f"[the rules]({doc('rules.md')})) and, where a rule is missing, the same PromQL over "
        "vLLM's own series, so a Prometheus without the rules still fills them; the variables "
        "list vLLM's own series. Panels reading the sidecar (`kvoffload_*`) need "
        "`kvoffload serve` scraped."
    )
    if listed:
        body = f"{intro}\n\n{NEEDS_RULES} (blank without them):\n\n" + "\n".join(listed)
    else:
        body = f"{intro}\n\nNo panel here needs the rules."
    if only_where:
        body += f"\n\n{ONLY_WHERE} (blank on other versions or settings):\n\n" + "\n".join(
            only_where
        )
    # Grid units of 30 px: the paragraph takes about four, each listed line about 0.8.
    height = 5 + (len(listed) + len(only_where)) * 4 // 5
    return [
        g.Section(
            "About this dashboard",
            [
                g.text(
                    NEEDS_RULES_TITLE,
                    "What this dashboard reads, and which panels stay blank on a Prometheus "
                    "without kvoffload's recording rules.",
                    body,
                    height=height,
                )
            ],
        ),
        *sections,
    ]


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
