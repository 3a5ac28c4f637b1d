"""PromQL renderings of the signal catalog, and the one config every rendering reads.

`signals.FIGURES` defines each derived figure once, as a formula (`formula.py`) that the
sidecar evaluates in Python and that this module renders as recording rules (`RENDERINGS`,
written by `rules.py`, read by `dashboards.py`): a rendering names the rule and its windows,
the formula gives its PromQL. The conventions (ratios of sums `by (<target labels>,
model_name)` over `(den > 0)`, both spellings `vllm[:_]x`, flat offload names `or` the
deprecated mirror) are the formula nodes'. Helper rules that are not figures (the offload
gate, traffic floors, fleet A/B, TTFT quantiles) are built here.

Figures built from config-info *labels* (capacities) cannot be computed in PromQL, which cannot
turn a label value into a number; their formula is `PythonOnly` with the reason,
`NOT_IN_PROMQL` lists them, and the rules read the sidecar's gauges for them instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvoffload.analysis.formula import (  # noqa: F401 (the text helpers rules and dashboards use)
    GATE_RECORD,
    Expr,
    Rate,
    Ratio,
    binop,
    by_labels,
    div,
    indent,
    paren,
    share_family,
    sidecar,
    sidecar_as_vllm,
    sum_fn,
    sum_rate,
    target_by,
    vllm,
)
from kvoffload.analysis.signals import FIGURES, FIGURES_BY_KEY, LOADED
from kvoffload.errors import InputError
from kvoffload.links import doc
from kvoffload.thresholds import Thresholds
from kvoffload.units import parse_duration

_ADVISOR = Thresholds()  # alert thresholds default to the sidecar advisor's, so both agree

ALERT_NAMES = (
    "KVOffloadRecommendEnable",
    "KVOffloadLowPrefixReuse",
    "KVOffloadSlowerThanRecompute",
    "KVOffloadBufferTooSmall",
    "KVOffloadBufferOversized",
    "KVOffloadTransferSlow",
    "KVOffloadMetricsMissing",
    "KVOffloadExporterTargetDown",
    "KVOffloadHostMemoryNearLimit",
    "KVOffloadSidecarDown",
)

_DEFAULT_FOR = {
    "KVOffloadRecommendEnable": "30m",
    "KVOffloadLowPrefixReuse": "30m",
    "KVOffloadSlowerThanRecompute": "30m",
    "KVOffloadBufferTooSmall": "15m",
    "KVOffloadBufferOversized": "1h",
    "KVOffloadTransferSlow": "15m",
    "KVOffloadMetricsMissing": "15m",
    "KVOffloadExporterTargetDown": "10m",
    "KVOffloadHostMemoryNearLimit": "5m",
    "KVOffloadSidecarDown": "10m",
}

# Settings renamed to the advisor's names (one name per threshold); the old names still work.
RENAMED_SETTINGS = {
    "min_gpu_prefix_hit_ratio": "min_reuse_evidence_ratio",
    "min_ttft_cost_seconds": "min_ttft_saving_seconds",
}

_PROM_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# The settings that are label matchers spliced into every selector, and their CLI flags.
SELECTOR_SETTINGS = {"vllm_selector": "--selector", "sidecar_selector": "--sidecar-selector"}


def check_matchers(what: str, value: str) -> str:
    """`value` as PromQL label matchers to splice into `{__name__=~"…", <here>, …}`, or
    InputError (one line) when it is anything else: an unbalanced quote, a bare word, a
    second selector or operator smuggled in, `__name__`, Prometheus 3's `or` between matcher
    sets. Surrounding braces and a trailing comma are dropped; "" means no extra matchers."""
    text = value.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    text = text.rstrip(", \t\n")
    if not text:
        return ""
    from kvoffload.mixin.validate import promql_parser as parser  # the `generate` extra

    promql_parser = parser()
    example = 'e.g. job="vllm", namespace="prod"'
    try:
        tree = promql_parser.parse(f'{{__name__="kvoffload_check", {text}}}')
    except ValueError as exc:
        why = str(exc).splitlines()[0] if str(exc) else "does not parse"
        raise InputError(
            f"{what}: {value!r} is not PromQL label matchers ({why}); {example}"
        ) from None
    if not isinstance(tree, promql_parser.VectorSelector) or tree.name:
        raise InputError(f"{what}: {value!r} is more than label matchers; {example}")
    if tree.matchers.or_matchers:
        raise InputError(f"{what}: {value!r}: one set of matchers, no `or`; {example}")
    if sum(m.name == "__name__" for m in tree.matchers.matchers) > 1:
        raise InputError(f"{what}: {value!r}: the metric name is the generator's, not a matcher")
    return text


@dataclass(frozen=True)
class MixinConfig:
    """Selectors, windows, thresholds and names of everything generated (the mixin `_config`).

    Users regenerate with their own values (`kvoffload generate`); every field has a default
    that suits a plain `job="vllm"` scrape next to a `job="kvoffload"` sidecar.
    """

    # -- what to read ----------------------------------------------------------------------
    # Matchers added to every vLLM selector; they must be target labels (they also select `up`).
    vllm_selector: str = 'job="vllm"'
    # Matchers selecting the sidecar's own series.
    sidecar_selector: str = 'job="kvoffload"'
    # Labels that tell scrape targets apart; figures are grouped by these and model_name.
    target_labels: tuple[str, ...] = ("job", "instance")
    # The sidecar names its vLLM target (host:port of the URL it scrapes) in this label; it is
    # copied into `instance` to join the sidecar's capacities with the vLLM rules.
    sidecar_target_label: str = "target"
    # vLLM adds the copy times of all TP×PP ranks: load tokens/s multiplies by this.
    world_size: int = 1

    # -- windows ---------------------------------------------------------------------------
    rate_window: str = "5m"  # fast figures: hit ratios, bandwidth, rates
    slow_window: str = "1h"  # slow figures: reuse ratio, wasted bytes, fill time, alerts on them

    # -- thresholds: those the advisor has too carry its name and default, so a key means the
    # same to `serve --threshold` and `generate --set`, and an alert mirroring an advisor rule
    # renders the advisor's own condition (conditions.py) ----------------------------------
    pressure_gpu_kv_usage: float = _ADVISOR.pressure_gpu_kv_usage
    low_gpu_prefix_hit_ratio: float = _ADVISOR.low_gpu_prefix_hit_ratio
    min_reuse_evidence_ratio: float = _ADVISOR.min_reuse_evidence_ratio
    reuse_horizon_seconds: float = _ADVISOR.reuse_horizon_seconds
    low_reuse_ratio: float = _ADVISOR.low_reuse_ratio
    min_ttft_saving_seconds: float = _ADVISOR.min_ttft_saving_seconds
    oversized_fill_seconds: float = _ADVISOR.oversized_fill_seconds
    # Alert-only thresholds (traffic floors, the transfer floor).
    min_prefix_query_tokens_per_second: float = 1000.0
    min_store_bytes_per_second: float = 1e6
    # The reload-vs-recompute throughput ratio under which the dashboard colours it red: a
    # figure, not a verdict (the advisor judges by TTFT).
    min_speedup: float = 1.2
    min_load_bytes_per_second: float = 1e6
    transfer_slow_bytes_per_second: float = 5e9
    min_prompt_tokens_per_second: float = 10.0
    min_allocation_failures_per_second: float = _ADVISOR.min_allocation_failures_per_second
    # Unreclaimable memory of vLLM's container over its limit at which the OOM alert fires.
    host_memory_near_limit_ratio: float = 0.9

    # -- alerts ----------------------------------------------------------------------------
    alert_for: dict[str, str] = field(default_factory=lambda: dict(_DEFAULT_FOR))
    severity_info: str = "info"
    severity_warning: str = "warning"
    # Absolute: a runbook_url is clicked in a notification, far from this repository.
    runbook_url_base: str = doc("runbooks.md")
    rules_group: str = "kvoffload.rules"
    alerts_group: str = "kvoffload.alerts"
    prometheusrule_name: str = "kvoffload"
    prometheusrule_namespace: str | None = None
    prometheusrule_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "kvoffload", "role": "alert-rules"}
    )

    # -- dashboards ------------------------------------------------------------------------
    # Nominal peak of the host link, drawn as a reference line (PCIe 4.0 x16 ≈ 25 GB/s).
    link_peak_bytes_per_second: float = 25e9
    dashboard_uid_prefix: str = "kvoffload"
    dashboard_title_prefix: str = "kvoffload / "
    dashboard_tags: tuple[str, ...] = ("kvoffload", "vllm")
    dashboard_refresh: str = "30s"
    dashboard_time_from: str = "now-3h"
    # Panels read `rule or <the rule's own PromQL>` so they work without the rules; a large
    # fleet with the rules loaded may turn it off, sparing Prometheus the raw side's cost.
    dashboard_raw_fallback: bool = True

    def __post_init__(self) -> None:
        for name in ("rate_window", "slow_window"):
            value = getattr(self, name)
            if not _PROM_DURATION.match(value):
                raise InputError(f"{name}={value!r}: not a Prometheus duration (e.g. 5m, 1h)")
        for name, value in self.alert_for.items():
            if name not in ALERT_NAMES:
                raise InputError(f"alert_for: unknown alert {name!r}")
            if not _PROM_DURATION.match(value):
                raise InputError(f"alert_for[{name}]={value!r}: not a Prometheus duration")
        missing = set(ALERT_NAMES) - set(self.alert_for)
        if missing:
            raise InputError(f"alert_for: no duration for {', '.join(sorted(missing))}")
        for label in (*self.target_labels, self.sidecar_target_label):
            if not _LABEL_NAME.match(label):
                raise InputError(f"{label!r}: not a Prometheus label name")
        if "instance" not in self.target_labels:
            # The sidecar join and the dashboards' $instance variable both rely on it.
            raise InputError("target_labels must include 'instance'")
        if self.world_size < 1:
            raise InputError("world_size must be >= 1")
        for name, flag in SELECTOR_SETTINGS.items():
            # Normalised (braces and a trailing comma dropped) so it splices into a selector.
            object.__setattr__(self, name, check_matchers(f"{name} ({flag})", getattr(self, name)))

    @property
    def slow_window_seconds(self) -> float:
        return _seconds(self.slow_window)

    @property
    def window_seconds(self) -> float:
        """The window a condition's `window_seconds` means in the alerts (conditions.py): the
        slow window, which the alerts on reuse and fill time judge over."""
        return self.slow_window_seconds

    def record_name(self, key: str) -> str:
        """The recording rule that renders figure `key` (analysis.scope.Scope asks for it)."""
        return record_name(key, self)

    def with_overrides(self, **overrides: Any) -> MixinConfig:
        overrides = {RENAMED_SETTINGS.get(k, k): v for k, v in overrides.items()}
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise InputError(
                f"unknown setting(s): {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        return replace(self, **overrides)


def _seconds(duration: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration):
        if unit in ("w", "y"):
            total += float(number) * (604800.0 if unit == "w" else 31536000.0)
        else:
            total += parse_duration(f"{number}{unit}")
    return total


# -- building blocks (formula.py holds the text helpers; rules and dashboards use them) -------
OFFLOAD_PRESENCE = (
    "kv_offload_(load|store)_bytes_total|kv_offload_total_bytes_total"
    "|kv_offload_cpu_cache_usage_perc"
)


def offload_configured(cfg: MixinConfig) -> str:
    """1 per target where offloading is on: offload series exist, or the config says a size."""
    present = vllm(cfg, f"({OFFLOAD_PRESENCE})")
    sized = vllm(cfg, "cache_config_info", 'kv_offloading_size!="None"')
    by = target_by(cfg)
    return f"group by ({by}) ({present})\nor\ngroup by ({by}) ({sized})"


# -- the renderings ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendering:
    """One recording rule family: `level:metric:<op><window>` for each window it is needed at.

    `keys` are the signal catalog figures it renders (empty for helper rules that only feed
    alerts and dashboards); `labels` are static labels that tell series of one name apart.
    """

    keys: tuple[str, ...]
    metric: str
    op: str
    windows: tuple[str, ...]  # "fast" (rate_window) and/or "slow" (slow_window)
    build: Callable[[MixinConfig, str], str]
    level: str = "model_name"
    labels: tuple[tuple[str, str], ...] = ()
    help: str = ""

    def window(self, cfg: MixinConfig, which: str) -> str:
        return cfg.rate_window if which == "fast" else cfg.slow_window

    def record(self, cfg: MixinConfig, which: str | None = None) -> str:
        window = self.window(cfg, which) if which else ""
        return f"{self.level}:{self.metric}:{self.op}{window}"


def _figure(key: str) -> Callable[[MixinConfig, str], str]:
    """The PromQL of a figure: its one formula (signals.FIGURES), rendered."""
    formula = FIGURES_BY_KEY[key].formula
    return lambda cfg, w: formula.promql(cfg, w)


def _shares(*keys: str) -> Callable[[MixinConfig, str], str]:
    """Figures that differ only in one label's value, rendered as one rule keeping it."""
    shares: list[Ratio] = []
    for key in keys:
        formula = FIGURES_BY_KEY[key].formula
        assert isinstance(formula, Ratio), key
        shares.append(formula)
    label = FIGURES_BY_KEY[keys[0]].labels[0][0]
    return lambda cfg, w: share_family(cfg, w, shares, label)


def _fleet_mean_ttft(offloading: bool) -> Callable[[MixinConfig, str], str]:
    """Mean TTFT per model over the replicas with (or without) offloading: fleet A/B."""

    def build(cfg: MixinConfig, w: str) -> str:
        gate = f"{'and' if offloading else 'unless'} on ({target_by(cfg)}) {GATE_RECORD}"

        def total(part: str) -> str:
            gated = f"{sum_rate(cfg, f'time_to_first_token_seconds_{part}', w)}\n{gate}"
            return f"sum by (model_name) (\n{indent(gated)}\n)"

        return div(total("sum"), total("count"))

    return build


def _fleet_effect(cfg: MixinConfig, w: str) -> str:
    """Fleet A/B: mean TTFT of a model's replicas with a tier minus those without (seconds;
    negative = the tier makes TTFT better). Load is not matched: read it next to the rates."""
    mean = f"model_name:vllm_time_to_first_token_seconds:fleet_mean_rate{w}"
    return f'{mean}{{offloading="on"}}\n- ignoring (offloading)\n{mean}{{offloading="off"}}'


def _helper(formula: Expr) -> Callable[[MixinConfig, str], str]:
    return lambda cfg, w: formula.promql(cfg, w)


def _ttft_quantile(q: str) -> Callable[[MixinConfig, str], str]:
    def build(cfg: MixinConfig, w: str) -> str:
        buckets = sum_fn(cfg, "rate", "time_to_first_token_seconds_bucket", w, extra_by=("le",))
        quantile = f"histogram_quantile({q}, {buckets})"
        # All-zero buckets (idle) give NaN: keep only groups that finished requests.
        busy = paren(f"{sum_rate(cfg, 'time_to_first_token_seconds_count', w)} > 0")
        return f"{quantile}\nand on ({by_labels(cfg)})\n{busy}"

    return build


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
    Rendering(
        ("offload_hit_ratio",),
        "vllm_kv_offload_hit",
        "ratio_rate",
        ("fast",),
        _figure("offload_hit_ratio"),
    ),
    Rendering(
        ("gpu_prefix_hit_ratio",),
        "vllm_prefix_cache_hit",
        "ratio_rate",
        ("fast",),
        _figure("gpu_prefix_hit_ratio"),
    ),
    Rendering(
        ("prompt_share_local_compute", "prompt_share_local_cache_hit", "prompt_share_external"),
        "vllm_prompt_tokens_by_source",
        "ratio_rate",
        ("fast",),
        _shares(
            "prompt_share_local_compute", "prompt_share_local_cache_hit", "prompt_share_external"
        ),
    ),
    Rendering(
        ("load_gbps",),
        "vllm_kv_offload_load_bytes_per_second",
        "ratio_rate",
        ("fast", "slow"),
        _figure("load_gbps"),
    ),
    Rendering(
        ("store_gbps",),
        "vllm_kv_offload_store_bytes_per_second",
        "ratio_rate",
        ("fast",),
        _figure("store_gbps"),
    ),
    Rendering(
        ("reuse_ratio",), "vllm_kv_offload_reuse", "ratio_rate", ("slow",), _figure("reuse_ratio")
    ),
    Rendering(
        ("wasted_bytes",),
        "vllm_kv_offload_wasted_bytes",
        "increase",
        ("slow",),
        _figure("wasted_bytes"),
    ),
    Rendering(
        ("loaded_bytes",),
        "vllm_kv_offload_load_bytes",
        "increase",
        ("slow",),
        _figure("loaded_bytes"),
    ),
    Rendering(
        ("stored_bytes",),
        "vllm_kv_offload_store_bytes",
        "increase",
        ("slow",),
        _figure("stored_bytes"),
    ),
    Rendering(
        ("store_rate_bytes_per_second",),
        "vllm_kv_offload_store_bytes",
        "rate",
        ("fast", "slow"),
        _figure("store_rate_bytes_per_second"),
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
    Rendering(
        ("kv_bytes_per_token",),
        "vllm_kv_offload_bytes_per_token",
        "ratio",
        ("slow",),
        _figure("kv_bytes_per_token"),
    ),
    Rendering(
        ("recompute_tokens_per_second",),
        "vllm_prefill_computed_tokens_per_second",
        "ratio_rate",
        ("fast",),
        _figure("recompute_tokens_per_second"),
    ),
    Rendering(
        ("load_tokens_per_second",),
        "vllm_kv_offload_loaded_tokens_per_second",
        "ratio_rate",
        ("fast",),
        _figure("load_tokens_per_second"),
    ),
    Rendering(
        ("speedup",),
        "vllm_kv_offload_load_speedup",
        "ratio_rate",
        ("fast", "slow"),
        _figure("speedup"),
    ),
    Rendering(
        ("cpu_fill_seconds",),
        "kvoffload_cpu_fill_seconds",
        "ratio_rate",
        ("slow",),
        _figure("cpu_fill_seconds"),
    ),
    Rendering(
        ("gpu_turnover_seconds",),
        "kvoffload_gpu_turnover_seconds",
        "ratio_rate",
        ("fast",),
        _figure("gpu_turnover_seconds"),
    ),
    Rendering(
        ("stored_bytes_since_start",),
        "vllm_kv_offload_store_bytes",
        "sum",
        (),
        _figure("stored_bytes_since_start"),
    ),
    Rendering(
        ("cpu_fill_ratio_since_start",),
        "kvoffload_cpu_fill_since_start",
        "ratio",
        (),
        _figure("cpu_fill_ratio_since_start"),
    ),
    Rendering(
        ("mean_ttft_seconds",),
        "vllm_time_to_first_token_seconds",
        "mean_rate",
        ("fast",),
        _figure("mean_ttft_seconds"),
    ),
    Rendering(
        ("mean_queue_seconds",),
        "vllm_request_queue_time_seconds",
        "mean_rate",
        ("fast",),
        _figure("mean_queue_seconds"),
    ),
    # The TTFT model's parts that are closed formulas of rates (docs/advisor.md, "What
    # Prometheus alone shows").
    Rendering(
        ("mean_prefill_seconds",),
        "vllm_request_prefill_time_seconds",
        "mean_rate",
        ("fast",),
        _figure("mean_prefill_seconds"),
    ),
    Rendering(
        ("capacity_queue_seconds",),
        "vllm_request_capacity_queue_seconds",
        "mean_rate",
        ("fast",),
        _figure("capacity_queue_seconds"),
    ),
    Rendering(
        ("reload_wait_seconds",),
        "vllm_request_reload_wait_seconds",
        "mean_rate",
        ("fast",),
        _figure("reload_wait_seconds"),
    ),
    Rendering(
        ("requests_in_system",),
        "vllm_requests_in_system",
        "mean_rate",
        ("fast",),
        _figure("requests_in_system"),
    ),
    Rendering(
        ("reloaded_tokens_per_request",),
        "vllm_kv_offload_loaded_tokens_per_request",
        "ratio_rate",
        ("fast",),
        _figure("reloaded_tokens_per_request"),
    ),
    Rendering(
        ("loads_per_request",),
        "vllm_kv_offload_loads_per_request",
        "ratio_rate",
        ("fast",),
        _figure("loads_per_request"),
    ),
    Rendering(
        ("load_copy_seconds",),
        "vllm_kv_offload_load_copy_seconds",
        "mean_rate",
        ("fast",),
        _figure("load_copy_seconds"),
    ),
    Rendering(
        ("gpu_kv_usage_ratio",),
        "vllm_kv_cache_usage_perc",
        "avg_over_time",
        ("fast",),
        _figure("gpu_kv_usage_ratio"),
    ),
    Rendering(
        ("waiting_for_capacity",),
        "vllm_num_requests_waiting_for_capacity",
        "avg_over_time",
        ("fast",),
        _figure("waiting_for_capacity"),
    ),
    Rendering(
        ("preemptions_per_second",),
        "vllm_num_preemptions",
        "rate",
        ("fast",),
        _figure("preemptions_per_second"),
    ),
    Rendering(
        ("allocation_failures_per_second",),
        "vllm_kv_offload_allocation_failure",
        "rate",
        ("fast",),
        _figure("allocation_failures_per_second"),
    ),
    Rendering(
        ("prompt_tokens_per_second",),
        "vllm_prompt_tokens",
        "rate",
        ("fast", "slow"),
        _figure("prompt_tokens_per_second"),
    ),
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
        "fleet_mean_rate",
        ("slow",),
        _fleet_mean_ttft(True),
        labels=(("offloading", "on"),),
        help="Mean TTFT per model over its replicas with offloading (fleet A/B).",
    ),
    Rendering(
        (),
        "vllm_time_to_first_token_seconds",
        "fleet_mean_rate",
        ("slow",),
        _fleet_mean_ttft(False),
        labels=(("offloading", "off"),),
        help="Mean TTFT per model over its replicas without offloading (fleet A/B).",
    ),
    Rendering(
        (),
        "kvoffload_offload_ttft_effect_seconds",
        "fleet_rate",
        ("slow",),
        _fleet_effect,
        help="Fleet A/B: mean TTFT with a tier minus without, per model (negative = "
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


def record_name(key: str, cfg: MixinConfig, which: str | None = None) -> str:
    """The recording rule that renders figure `key` (at its first window unless told)."""
    r = rendering_for(key)
    return r.record(cfg, which or (r.windows[0] if r.windows else None))


def helper_record(metric: str, op: str, cfg: MixinConfig, which: str) -> str:
    for r in RENDERINGS:
        if r.metric == metric and r.op == op and which in r.windows:
            return r.record(cfg, which)
    raise KeyError((metric, op, which))


def figure_expr(key: str, cfg: MixinConfig, which: str | None = None) -> str:
    """The PromQL of figure `key`, as its recording rule evaluates it."""
    r = rendering_for(key)
    which = which or (r.windows[0] if r.windows else None)
    return r.build(cfg, r.window(cfg, which) if which else "")
