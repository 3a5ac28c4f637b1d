"""The recording rules that render the signal catalog in PromQL, one `Rendering` per family.

Each figure of `signals.FIGURES` is one formula (`formula.py`), and a rendering names its rule.
So rules, alerts and dashboards read the same figure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvoffload.analysis.formula import (
    GATE_RECORD,
    Expr,
    Rate,
    Ratio,
    by_labels,
    div,
    indent,
    paren,
    share_family,
    sum_fn,
    sum_rate,
    target_by,
    vllm,
)
from kvoffload.analysis.signals import FIGURES, FIGURES_BY_KEY, LOADED, PER_TIER_FIGURES
from kvoffload.mixin.settings import Settings

# -- building blocks (formula.py holds the text helpers; rules and dashboards use them) -------
OFFLOAD_PRESENCE = (
    "kv_offload_(load|store)_bytes_total|kv_offload_total_bytes_total"
    "|kv_offload_cpu_cache_usage_perc"
)


def offload_configured(cfg: Settings) -> str:
    """1 per target where offloading is on: offload series exist, or the config says a size."""
    present = vllm(cfg, f"({OFFLOAD_PRESENCE})")
    sized = vllm(cfg, "cache_config_info", 'kv_offloading_size!="None"')
    by = target_by(cfg)
    return f"group by ({by}) ({present})\nor\ngroup by ({by}) ({sized})"


# -- the renderings ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendering:
    """One recording rule family: `level:metric:<op><window>` for each window it is needed at.

    A figure's rule name is declared here once, and rules, alerts and dashboards derive it."""

    keys: tuple[str, ...]  # the catalog figures it renders; empty for helper rules
    metric: str
    op: str
    windows: tuple[str, ...]  # "fast" (rate_window) and/or "slow" (slow_window)
    build: Callable[[Settings, str], str]
    level: str = "model_name"
    labels: tuple[tuple[str, str], ...] = ()  # static labels telling series of one name apart
    help: str = ""

    def window(self, cfg: Settings, which: str) -> str:
        return cfg.rate_window if which == "fast" else cfg.slow_window

    def record(self, cfg: Settings, which: str | None = None) -> str:
        window = self.window(cfg, which) if which else ""
        return f"{self.level}:{self.metric}:{self.op}{window}"


def _figure(key: str) -> Callable[[Settings, str], str]:
    """The PromQL of a figure: its one formula (signals.FIGURES), rendered."""
    formula = FIGURES_BY_KEY[key].formula
    return lambda cfg, w: formula.promql(cfg, w)


def _figure_rule(key: str, metric: str, op: str, windows: tuple[str, ...]) -> Rendering:
    """The recording rule of one catalog figure.

    Why: the figure's key names both what the rule renders and its formula, so it is written once.
    """
    return Rendering((key,), metric, op, windows, _figure(key))


def _shares(*keys: str) -> Callable[[Settings, str], str]:
    """Figures that differ only in one label's value, rendered as one rule keeping it."""
    shares: list[Ratio] = []
    for key in keys:
        formula = FIGURES_BY_KEY[key].formula
        assert isinstance(formula, Ratio), key
        shares.append(formula)
    label = FIGURES_BY_KEY[keys[0]].labels[0][0]
    return lambda cfg, w: share_family(cfg, w, shares, label)


def _replica_mean_ttft(offloading: bool) -> Callable[[Settings, str], str]:
    """Mean TTFT per model over the replicas with (or without) offloading: replicas A/B."""

    def build(cfg: Settings, w: str) -> str:
        gate = f"{'and' if offloading else 'unless'} on ({target_by(cfg)}) {GATE_RECORD}"

        def total(part: str) -> str:
            gated = f"{sum_rate(cfg, f'time_to_first_token_seconds_{part}', w)}\n{gate}"
            return f"sum by (model_name) (\n{indent(gated)}\n)"

        return div(total("sum"), total("count"))

    return build


def _replica_effect(cfg: Settings, w: str) -> str:
    """Replicas A/B: mean TTFT of a model's replicas with a tier minus those without, in seconds.

    Negative means the tier makes TTFT better. Load is not matched: read it next to the rates."""
    mean = f"model_name:vllm_time_to_first_token_seconds:replica_mean_rate{w}"
    return f'{mean}{{offloading="on"}}\n- ignoring (offloading)\n{mean}{{offloading="off"}}'


def _helper(formula: Expr) -> Callable[[Settings, str], str]:
    return lambda cfg, w: formula.promql(cfg, w)


def _ttft_quantile(q: str) -> Callable[[Settings, str], str]:
    def build(cfg: Settings, w: str) -> str:
        buckets = sum_fn(cfg, "rate", "time_to_first_token_seconds_bucket", w, extra_by=("le",))
        quantile = f"histogram_quantile({q}, {buckets})"
        # All-zero buckets (idle) give NaN: keep only groups that finished requests.
        busy = paren(f"{sum_rate(cfg, 'time_to_first_token_seconds_count', w)} > 0")
        return f"{quantile}\nand on ({by_labels(cfg)})\n{busy}"

    return build


# One lookup call's time: the CPU spec's histogram (the tiering spec exports it too; its own
# tiering_lookup_* histograms time a whole request's lookups, another quantity).
LOOKUP_HISTOGRAMS = ("kv_offload_lookup_sync_delay_seconds",)


def _lookup_p99(cfg: Settings, w: str) -> str:
    """p99 of one lookup call's time from the CPU spec's histogram; absent where no lookup
    finished in the window."""
    parts = []
    for name in LOOKUP_HISTOGRAMS:
        buckets = sum_fn(cfg, "rate", f"{name}_bucket", w, extra_by=("le",))
        busy = paren(f"{sum_rate(cfg, f'{name}_count', w)} > 0")
        parts.append(f"histogram_quantile(0.99, {buckets})\nand on ({by_labels(cfg)})\n{busy}")
    return "\nor\n".join(paren(p) for p in parts)


# The newer series and the secondary tiers (analysis.signals; dashboards.tiers shows them).
TIER_RENDERINGS: tuple[Rendering, ...] = (
    _figure_rule("tier_hit_ratio", "vllm_kv_offload_tiering_chunk_hit", "ratio_rate", ("fast",)),
    _figure_rule(
        "primary_tier_hit_ratio",
        "vllm_kv_offload_tiering_primary_chunk_hit",
        "ratio_rate",
        ("fast",),
    ),
    _figure_rule(
        "tier_read_bytes_per_second", "vllm_kv_offload_tiering_read_bytes", "rate", ("fast",)
    ),
    _figure_rule(
        "tier_write_bytes_per_second", "vllm_kv_offload_tiering_write_bytes", "rate", ("fast",)
    ),
    _figure_rule(
        "tier_read_gbps", "vllm_kv_offload_tiering_read_bytes_per_second", "ratio_rate", ("fast",)
    ),
    _figure_rule(
        "tier_write_gbps", "vllm_kv_offload_tiering_write_bytes_per_second", "ratio_rate", ("fast",)
    ),
    _figure_rule(
        "tier_promotion_failures_per_second",
        "vllm_kv_offload_tiering_promotion_job_failures",
        "rate",
        ("fast",),
    ),
    _figure_rule(
        "tier_cascade_failures_per_second",
        "vllm_kv_offload_tiering_cascade_job_failures",
        "rate",
        ("fast",),
    ),
    _figure_rule(
        "promotion_allocation_failures_per_second",
        "vllm_kv_offload_tiering_promotion_allocation_failures",
        "rate",
        ("fast",),
    ),
    _figure_rule(
        "tier_active_promotions",
        "vllm_kv_offload_tiering_active_promotion_jobs",
        "avg_over_time",
        ("fast",),
    ),
    _figure_rule(
        "tier_active_cascades",
        "vllm_kv_offload_tiering_active_cascade_jobs",
        "avg_over_time",
        ("fast",),
    ),
    _figure_rule("stores_skipped_per_second", "vllm_kv_offload_stores_skipped", "rate", ("fast",)),
    _figure_rule(
        "mean_allocation_chunks", "vllm_kv_offload_cpu_allocation_size", "mean_rate", ("fast",)
    ),
    _figure_rule(
        "mean_lookup_seconds", "vllm_kv_offload_lookup_sync_delay_seconds", "mean_rate", ("fast",)
    ),
    _figure_rule(
        "tier_lookup_blocking_seconds",
        "vllm_kv_offload_tiering_lookup_sync_delay_seconds",
        "mean_rate",
        ("fast",),
    ),
    _figure_rule(
        "tier_lookup_wait_seconds",
        "vllm_kv_offload_tiering_lookup_async_delay_seconds",
        "mean_rate",
        ("fast",),
    ),
    Rendering(
        (),
        "vllm_kv_offload_lookup_sync_delay_seconds",
        "histogram_quantile_rate",
        ("fast",),
        _lookup_p99,
        labels=(("quantile", "0.99"),),
        help="p99 of one offload lookup call's time (the CPU spec's histogram).",
    ),
)


def _by_tier(row: Rendering) -> Rendering:
    """A tier figure's rule again with the `tier` label kept: each secondary tier apart.

    Why: the summed rule lets a fast tier hide a slow one (the sidecar's kvoffload_tier_* too).
    """
    fig = FIGURES_BY_KEY[row.keys[0]]

    def build(cfg: Settings, w: str) -> str:
        return fig.formula.promql(replace(cfg, target_labels=(*cfg.target_labels, "tier")), w)

    return Rendering(
        (), row.metric, row.op, row.windows, build, level="model_name_tier", help=fig.help
    )


_PER_TIER_KEYS = {fig.key for fig in PER_TIER_FIGURES}
PER_TIER_RENDERINGS = tuple(
    _by_tier(row) for row in TIER_RENDERINGS if row.keys and row.keys[0] in _PER_TIER_KEYS
)


RENDERINGS: tuple[Rendering, ...] = (
    Rendering(
        (),
        "vllm_kv_offload_configured",
        "group",
        (),
        lambda cfg, _w: offload_configured(cfg),
        level="instance",
        help="1 per target with KV offloading on (offload series, or a configured size).",
    ),
    _figure_rule("offload_hit_ratio", "vllm_kv_offload_hit", "ratio_rate", ("fast",)),
    _figure_rule("gpu_prefix_hit_ratio", "vllm_prefix_cache_hit", "ratio_rate", ("fast",)),
    Rendering(
        ("prompt_share_local_compute", "prompt_share_local_cache_hit", "prompt_share_external"),
        "vllm_prompt_tokens_by_source",
        "ratio_rate",
        ("fast",),
        _shares(
            "prompt_share_local_compute", "prompt_share_local_cache_hit", "prompt_share_external"
        ),
    ),
    _figure_rule(
        "load_gbps", "vllm_kv_offload_load_bytes_per_second", "ratio_rate", ("fast", "slow")
    ),
    _figure_rule("store_gbps", "vllm_kv_offload_store_bytes_per_second", "ratio_rate", ("fast",)),
    _figure_rule("reuse_ratio", "vllm_kv_offload_reuse", "ratio_rate", ("slow",)),
    _figure_rule("wasted_bytes", "vllm_kv_offload_wasted_bytes", "increase", ("slow",)),
    _figure_rule("loaded_bytes", "vllm_kv_offload_load_bytes", "increase", ("slow",)),
    _figure_rule("stored_bytes", "vllm_kv_offload_store_bytes", "increase", ("slow",)),
    _figure_rule(
        "store_rate_bytes_per_second", "vllm_kv_offload_store_bytes", "rate", ("fast", "slow")
    ),
    Rendering(
        (),
        "vllm_kv_offload_load_bytes",
        "rate",
        ("fast", "slow"),
        _helper(LOADED),
        help="Wall-clock load traffic (traffic floor of the transfer alerts).",
    ),
    # Loaded bytes ÷ loaded tokens since the engines started (the config's figure, from
    # labels, is the sidecar's only).
    _figure_rule("kv_bytes_per_token", "vllm_kv_offload_bytes_per_token", "ratio", ("slow",)),
    _figure_rule(
        "recompute_tokens_per_second",
        "vllm_prefill_computed_tokens_per_second",
        "ratio_rate",
        ("fast",),
    ),
    _figure_rule(
        "load_tokens_per_second",
        "vllm_kv_offload_loaded_tokens_per_second",
        "ratio_rate",
        ("fast",),
    ),
    _figure_rule("speedup", "vllm_kv_offload_load_speedup", "ratio_rate", ("fast", "slow")),
    _figure_rule("cpu_fill_seconds", "kvoffload_cpu_fill_seconds", "ratio_rate", ("slow",)),
    _figure_rule("gpu_turnover_seconds", "kvoffload_gpu_turnover_seconds", "ratio_rate", ("fast",)),
    _figure_rule("stored_bytes_since_start", "vllm_kv_offload_store_bytes", "sum", ()),
    _figure_rule("cpu_fill_ratio_since_start", "kvoffload_cpu_fill_since_start", "ratio", ()),
    _figure_rule("mean_ttft_seconds", "vllm_time_to_first_token_seconds", "mean_rate", ("fast",)),
    _figure_rule("mean_queue_seconds", "vllm_request_queue_time_seconds", "mean_rate", ("fast",)),
    # The TTFT model's parts that are closed formulas of rates (docs/advisor.md, "What
    # Prometheus alone shows").
    _figure_rule(
        "mean_prefill_seconds", "vllm_request_prefill_time_seconds", "mean_rate", ("fast",)
    ),
    _figure_rule(
        "capacity_queue_seconds", "vllm_request_capacity_queue_seconds", "mean_rate", ("fast",)
    ),
    _figure_rule("reload_wait_seconds", "vllm_request_reload_wait_seconds", "mean_rate", ("fast",)),
    _figure_rule("requests_in_system", "vllm_requests_in_system", "mean_rate", ("fast",)),
    _figure_rule(
        "reloaded_tokens_per_request",
        "vllm_kv_offload_loaded_tokens_per_request",
        "ratio_rate",
        ("fast",),
    ),
    _figure_rule("loads_per_request", "vllm_kv_offload_loads_per_request", "ratio_rate", ("fast",)),
    _figure_rule("load_copy_seconds", "vllm_kv_offload_load_copy_seconds", "mean_rate", ("fast",)),
    _figure_rule("gpu_kv_usage_ratio", "vllm_kv_cache_usage_perc", "avg_over_time", ("fast",)),
    _figure_rule(
        "waiting_for_capacity", "vllm_num_requests_waiting_for_capacity", "avg_over_time", ("fast",)
    ),
    _figure_rule("preemptions_per_second", "vllm_num_preemptions", "rate", ("fast",)),
    _figure_rule(
        "allocation_failures_per_second", "vllm_kv_offload_allocation_failure", "rate", ("fast",)
    ),
    *TIER_RENDERINGS,
    *PER_TIER_RENDERINGS,
    _figure_rule("prompt_tokens_per_second", "vllm_prompt_tokens", "rate", ("fast", "slow")),
    Rendering(
        (),
        "vllm_prefix_cache_queries",
        "rate",
        ("fast",),
        _helper(Rate("prefix_queries")),
        help="Prompt tokens looked up in the GPU prefix cache (traffic floor).",
    ),
    Rendering(
        (),
        "vllm_time_to_first_token_seconds",
        "replica_mean_rate",
        ("slow",),
        _replica_mean_ttft(True),
        labels=(("offloading", "on"),),
        help="Mean TTFT per model over its replicas with offloading (replicas A/B).",
    ),
    Rendering(
        (),
        "vllm_time_to_first_token_seconds",
        "replica_mean_rate",
        ("slow",),
        _replica_mean_ttft(False),
        labels=(("offloading", "off"),),
        help="Mean TTFT per model over its replicas without offloading (replicas A/B).",
    ),
    Rendering(
        (),
        "vllm_time_to_first_token_seconds",
        "replica_ab_rate",
        ("slow",),
        _replica_effect,
        help="Replicas A/B: mean TTFT with a tier minus without, per model (negative = "
        "faster); load is not matched.",
    ),
    *(
        Rendering(
            (),
            "vllm_time_to_first_token_seconds",
            "histogram_quantile_rate",
            ("fast",),
            _ttft_quantile(q),
            labels=(("quantile", q),),
            help=f"TTFT {float(q):.0%} quantile.",
        )
        for q in ("0.5", "0.9", "0.99")
    ),
)

# Figures PromQL cannot compute at all, and why (their formula is PythonOnly): the rules and
# dashboards read the sidecar's gauges for them (docs/rules.md says the same).
NOT_IN_PROMQL: dict[str, str] = {
    f.key: f.promql_why_not for f in FIGURES if f.promql_why_not is not None
}


def rendering_for(key: str) -> Rendering:
    for r in RENDERINGS:
        if key in r.keys:
            return r
    raise KeyError(key)


def record_name(key: str, cfg: Settings, which: str | None = None) -> str:
    """The recording rule that renders figure `key` (at its first window unless told)."""
    r = rendering_for(key)
    return r.record(cfg, which or (r.windows[0] if r.windows else None))


def helper_record(metric: str, op: str, cfg: Settings, which: str) -> str:
    for r in RENDERINGS:
        if r.metric == metric and r.op == op and which in r.windows:
            return r.record(cfg, which)
    raise KeyError((metric, op, which))


def figure_expr(key: str, cfg: Settings, which: str | None = None) -> str:
    """The PromQL of figure `key`, as its recording rule evaluates it."""
    r = rendering_for(key)
    which = which or (r.windows[0] if r.windows else None)
    return r.build(cfg, r.window(cfg, which) if which else "")
