"""PromQL renderings of the signal catalog, and the one config every rendering reads.

`signals.FIGURES` defines each derived figure once, in Python, for the sidecar. This module
renders the same figures as PromQL for recording rules (`rules.py`) and dashboards
(`dashboards.py`), keyed by the same figure keys, following the same conventions:

- ratios are ratios of sums over engines, `by (<target labels>, model_name)`, and divide by
  `(den > 0)` so that an idle engine yields no sample instead of NaN ("undefined is absent");
- every vLLM name is matched under both spellings Prometheus may store it with: `vllm:x`
  (text format, Prometheus 3) and `vllm_x` (Prometheus 2 negotiating OpenMetrics escapes colons),
  via `{__name__=~"vllm[:_]x"}`;
- offload transfers prefer the flat names (vLLM >= 0.24) and fall back to the deprecated
  `transfer_type` series with `or`, which keeps the left side wherever it exists, so the
  mirrors are never added together (vllm.py makes the same choice per family).

Figures built from config-info *labels* (capacities) cannot be computed in PromQL, which cannot
turn a label value into a number; `NOT_IN_PROMQL` says so and the rules read the sidecar's
gauges for them instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from kvoffload.advisor import Thresholds
from kvoffload.errors import InputError
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
}

_PROM_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


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

    # -- thresholds (defaults follow advisor.Thresholds where both exist) ------------------
    pressure_gpu_kv_usage: float = _ADVISOR.pressure_gpu_kv_usage
    low_gpu_prefix_hit_ratio: float = _ADVISOR.low_gpu_prefix_hit_ratio
    min_gpu_prefix_hit_ratio: float = _ADVISOR.min_reuse_evidence_ratio
    min_prefix_query_tokens_per_second: float = 1000.0
    low_reuse_ratio: float = _ADVISOR.low_reuse_ratio
    min_store_bytes_per_second: float = 1e6
    # The reload-vs-recompute throughput ratio under which the dashboard colours it red: a
    # figure, not a verdict (the advisor judges by TTFT).
    min_speedup: float = 1.2
    min_ttft_cost_seconds: float = _ADVISOR.min_ttft_saving_seconds
    min_load_bytes_per_second: float = 1e6
    transfer_slow_bytes_per_second: float = 5e9
    oversized_fill_seconds: float = _ADVISOR.oversized_fill_seconds
    min_prompt_tokens_per_second: float = 10.0
    min_allocation_failures_per_second: float = 0.0

    # -- alerts ----------------------------------------------------------------------------
    alert_for: dict[str, str] = field(default_factory=lambda: dict(_DEFAULT_FOR))
    severity_info: str = "info"
    severity_warning: str = "warning"
    runbook_url_base: str = "docs/runbooks.md"
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

    @property
    def slow_window_seconds(self) -> float:
        return _seconds(self.slow_window)

    def with_overrides(self, **overrides: object) -> MixinConfig:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise InputError(f"unknown setting(s): {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(known))})")
        return replace(self, **overrides)  # type: ignore[arg-type]


def _seconds(duration: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration):
        if unit in ("w", "y"):
            total += float(number) * (604800.0 if unit == "w" else 31536000.0)
        else:
            total += parse_duration(f"{number}{unit}")
    return total


# -- building blocks ---------------------------------------------------------------------------
def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def paren(expr: str) -> str:
    if "\n" in expr:
        return "(\n" + indent(expr) + "\n)"
    return f"({expr})"


def binop(left: str, op: str, right: str) -> str:
    """`left op right` laid out one operand per line once it gets long."""
    if "\n" in left or "\n" in right or len(left) + len(right) > 80:
        return f"{left}\n{op}\n{right}"
    return f"{left} {op} {right}"


def div(num: str, den: str) -> str:
    """A ratio that is absent, not NaN, when the denominator is zero."""
    return binop(num, "/", paren(f"{den} > 0" if "\n" not in den else den + "\n> 0"))


def by_labels(cfg: MixinConfig) -> str:
    return ", ".join((*cfg.target_labels, "model_name"))


def target_by(cfg: MixinConfig) -> str:
    return ", ".join(cfg.target_labels)


def vllm(cfg: MixinConfig, name: str, *matchers: str) -> str:
    """A selector for a vLLM sample name under both spellings (`vllm:` and escaped `vllm_`)."""
    parts = [f'__name__=~"vllm[:_]{name}"']
    if cfg.vllm_selector:
        parts.append(cfg.vllm_selector)
    parts.extend(matchers)
    return "{" + ", ".join(parts) + "}"


def sidecar(cfg: MixinConfig, name: str, *matchers: str) -> str:
    inner = ", ".join(m for m in (cfg.sidecar_selector, *matchers) if m)
    return f"{name}{{{inner}}}" if inner else name


def sum_fn(cfg: MixinConfig, fn: str, name: str, window: str, *matchers: str,
           extra_by: tuple[str, ...] = ()) -> str:
    by = ", ".join((*cfg.target_labels, "model_name", *extra_by))
    return f"sum by ({by}) ({fn}({vllm(cfg, name, *matchers)}[{window}]))"


def sum_rate(cfg: MixinConfig, name: str, window: str, *matchers: str) -> str:
    return sum_fn(cfg, "rate", name, window, *matchers)


_TRANSFER_TYPE = {"load": "CPU_to_GPU", "store": "GPU_to_CPU"}


def offload(cfg: MixinConfig, direction: str, kind: str, window: str, fn: str = "rate") -> str:
    """Load/store bytes or time: flat names when they exist, else the deprecated mirror."""
    flat = sum_fn(cfg, fn, f"kv_offload_{direction}_{kind}_total", window)
    legacy = sum_fn(cfg, fn, f"kv_offload_total_{kind}_total", window,
                    f'transfer_type="{_TRANSFER_TYPE[direction]}"')
    return paren(f"{flat}\nor\n{legacy}")


def loads_or_zero(cfg: MixinConfig, window: str, fn: str = "rate") -> str:
    """Load bytes, or 0 where only stores exist (vLLM <= 0.23 creates series on first use)."""
    return paren(f"{offload(cfg, 'load', 'bytes', window, fn)}\nor\n"
                 f"0 * {offload(cfg, 'store', 'bytes', window, fn)}")


def loaded_tokens(cfg: MixinConfig, window: str) -> str:
    """Tokens served by the offload tier: tier-attributed (0.33), else any connector's."""
    tiered = sum_rate(cfg, "prompt_tokens_cached_by_source_total", window, 'source=~"host|disk"')
    connector = sum_rate(cfg, "prompt_tokens_by_source_total", window,
                         'source="external_kv_transfer"')
    return paren(f"{tiered}\nor\n{connector}")


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


GATE_RECORD = "instance:vllm_kv_offload_configured:group"


def _offload_hit_ratio(cfg: MixinConfig, w: str) -> str:
    hits = paren(
        sum_rate(cfg, "prompt_tokens_cached_by_source_total", w, 'source=~"host|disk"')
        + "\nor\n" + sum_rate(cfg, "external_prefix_cache_hits_total", w)
    )
    ratio = div(hits, sum_rate(cfg, "external_prefix_cache_queries_total", w))
    # Without offloading the external counters still exist (at 0): gate on offloading.
    return binop(paren(ratio), f"and on ({target_by(cfg)})", GATE_RECORD)


def _prompt_shares(cfg: MixinConfig, w: str) -> str:
    by = by_labels(cfg)
    num = sum_fn(cfg, "rate", "prompt_tokens_by_source_total", w,
                 'source=~"local_compute|local_cache_hit|external_kv_transfer"',
                 extra_by=("source",))
    den = paren(f"{sum_rate(cfg, 'prompt_tokens_total', w)} > 0")
    return f"{num}\n/ on ({by}) group_left ()\n{den}"


def _bandwidth(direction: str) -> Callable[[MixinConfig, str], str]:
    return lambda cfg, w: div(offload(cfg, direction, "bytes", w),
                              offload(cfg, direction, "time", w))


def _load_tokens_per_second(cfg: MixinConfig, w: str) -> str:
    # load_time adds the copy times of all ranks copying in parallel: × world size.
    expr = div(paren(f"{loaded_tokens(cfg, w)}\n> 0"), offload(cfg, "load", "time", w))
    return expr if cfg.world_size == 1 else binop(paren(expr), "*", str(cfg.world_size))


def _recompute_tokens_per_second(cfg: MixinConfig, w: str) -> str:
    return div(sum_rate(cfg, "prompt_tokens_by_source_total", w, 'source="local_compute"'),
               sum_rate(cfg, "request_prefill_time_seconds_sum", w))


def _speedup(cfg: MixinConfig, w: str) -> str:
    return div(paren(_load_tokens_per_second(cfg, w)), _recompute_tokens_per_second(cfg, w))


def _mean(histogram: str) -> Callable[[MixinConfig, str], str]:
    return lambda cfg, w: div(sum_rate(cfg, f"{histogram}_sum", w),
                              sum_rate(cfg, f"{histogram}_count", w))


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
    return (f'{mean}{{offloading="on"}}\n- ignoring (offloading)\n'
            f'{mean}{{offloading="off"}}')


def _avg_gauge(name: str, *matchers: str) -> Callable[[MixinConfig, str], str]:
    # The sidecar averages engines at each scrape, then over the window: the same thing.
    return lambda cfg, w: (f"avg by ({by_labels(cfg)}) "
                           f"(avg_over_time({vllm(cfg, name, *matchers)}[{w}]))")


def _sum_gauge(name: str, *matchers: str) -> Callable[[MixinConfig, str], str]:
    # Request counts add up over engines (the sidecar sums engines at each scrape).
    return lambda cfg, w: (f"sum by ({by_labels(cfg)}) "
                           f"(avg_over_time({vllm(cfg, name, *matchers)}[{w}]))")


def _counter_rate(name: str) -> Callable[[MixinConfig, str], str]:
    return lambda cfg, w: sum_rate(cfg, name, w)


def _allocation_failures(cfg: MixinConfig, w: str) -> str:
    # The family is lazy (first failure): 0, not absent, wherever stores exist.
    return (f"{sum_rate(cfg, 'kv_offload_allocation_failure_total', w)}\nor\n"
            f"0 * {offload(cfg, 'store', 'bytes', w)}")


def _wasted(cfg: MixinConfig, w: str) -> str:
    diff = binop(offload(cfg, "store", "bytes", w, "increase"), "-",
                 loads_or_zero(cfg, w, "increase"))
    return f"clamp_min(\n{indent(diff)},\n  0\n)"


def _reuse(cfg: MixinConfig, w: str) -> str:
    return div(loads_or_zero(cfg, w), offload(cfg, "store", "bytes", w))


def _kv_bytes_per_token(cfg: MixinConfig, w: str) -> str:
    return div(offload(cfg, "load", "bytes", w), loaded_tokens(cfg, w))


def sidecar_as_vllm(cfg: MixinConfig, name: str, *matchers: str) -> str:
    """A sidecar gauge relabelled to join vLLM rules: its `target` names the vLLM instance."""
    return (f'label_replace({sidecar(cfg, name, *matchers)}, "instance", "$1", '
            f'"{cfg.sidecar_target_label}", "(.+)")')


def _per_sidecar(name: str, rate: Callable[[MixinConfig, str], str]
                 ) -> Callable[[MixinConfig, str], str]:
    """A sidecar capacity (PromQL cannot read it from labels) over a vLLM rate; group_right
    keeps the vLLM side's labels."""
    def build(cfg: MixinConfig, w: str) -> str:
        return (f"{sidecar_as_vllm(cfg, name)}\n/ on (instance, model_name) group_right ()\n"
                f"{paren(rate(cfg, w) + chr(10) + '> 0')}")
    return build


def _written_tokens(cfg: MixinConfig, w: str) -> str:
    # Every prompt token the GPU prefix cache missed is computed or loaded into it.
    return sum_rate(cfg, "prompt_tokens_by_source_total", w,
                    'source=~"local_compute|external_kv_transfer"')


def _stored_since_start(cfg: MixinConfig, _w: str) -> str:
    # The raw counters: what the engines stored since they started (resets start it over).
    by = by_labels(cfg)
    flat = vllm(cfg, "kv_offload_store_bytes_total")
    legacy = vllm(cfg, "kv_offload_total_bytes_total", 'transfer_type="GPU_to_CPU"')
    return f"sum by ({by}) ({flat})\nor\nsum by ({by}) ({legacy})"


def _fill_ratio_since_start(cfg: MixinConfig, w: str) -> str:
    capacity = paren(f"{sidecar_as_vllm(cfg, 'kvoffload_cpu_capacity_bytes')} > 0")
    return f"{paren(_stored_since_start(cfg, w))}\n/ on (instance, model_name) group_left ()\n" \
           f"{capacity}"


def _ttft_quantile(q: str) -> Callable[[MixinConfig, str], str]:
    def build(cfg: MixinConfig, w: str) -> str:
        buckets = sum_fn(cfg, "rate", "time_to_first_token_seconds_bucket", w, extra_by=("le",))
        quantile = f"histogram_quantile({q}, {buckets})"
        # All-zero buckets (idle) give NaN: keep only groups that finished requests.
        busy = paren(f"{sum_rate(cfg, 'time_to_first_token_seconds_count', w)} > 0")
        return f"{quantile}\nand on ({by_labels(cfg)})\n{busy}"
    return build


RENDERINGS: tuple[Rendering, ...] = (
    Rendering((), "vllm_kv_offload_configured", "group", (), lambda cfg, _w:
              offload_configured(cfg), level="instance",
              help="1 per target with KV offloading on (offload series, or a configured size)."),
    Rendering(("offload_hit_ratio",), "vllm_kv_offload_hit", "ratio_rate", ("fast",),
              _offload_hit_ratio),
    Rendering(("gpu_prefix_hit_ratio",), "vllm_prefix_cache_hit", "ratio_rate", ("fast",),
              lambda cfg, w: div(sum_rate(cfg, "prefix_cache_hits_total", w),
                                 sum_rate(cfg, "prefix_cache_queries_total", w))),
    Rendering(("prompt_share_local_compute", "prompt_share_local_cache_hit",
               "prompt_share_external"), "vllm_prompt_tokens_by_source", "ratio_rate",
              ("fast",), _prompt_shares),
    Rendering(("load_gbps",), "vllm_kv_offload_load_bytes_per_second", "ratio_rate",
              ("fast", "slow"), _bandwidth("load")),
    Rendering(("store_gbps",), "vllm_kv_offload_store_bytes_per_second", "ratio_rate",
              ("fast",), _bandwidth("store")),
    Rendering(("reuse_ratio",), "vllm_kv_offload_reuse", "ratio_rate", ("slow",), _reuse),
    Rendering(("wasted_bytes",), "vllm_kv_offload_wasted_bytes", "increase", ("slow",),
              _wasted),
    Rendering(("loaded_bytes",), "vllm_kv_offload_load_bytes", "increase", ("slow",),
              lambda cfg, w: loads_or_zero(cfg, w, "increase")),
    Rendering(("stored_bytes",), "vllm_kv_offload_store_bytes", "increase", ("slow",),
              lambda cfg, w: offload(cfg, "store", "bytes", w, "increase")),
    Rendering(("store_rate_bytes_per_second",), "vllm_kv_offload_store_bytes", "rate",
              ("fast", "slow"), lambda cfg, w: offload(cfg, "store", "bytes", w)),
    Rendering((), "vllm_kv_offload_load_bytes", "rate", ("fast", "slow"),
              lambda cfg, w: loads_or_zero(cfg, w),
              help="Wall-clock load traffic (traffic floor of the transfer alerts)."),
    Rendering(("kv_bytes_per_token",), "vllm_kv_offload_bytes_per_token", "ratio_rate",
              ("slow",), _kv_bytes_per_token),
    Rendering(("recompute_tokens_per_second",), "vllm_prefill_computed_tokens_per_second",
              "ratio_rate", ("fast",), _recompute_tokens_per_second),
    Rendering(("load_tokens_per_second",), "vllm_kv_offload_loaded_tokens_per_second",
              "ratio_rate", ("fast",), _load_tokens_per_second),
    Rendering(("speedup",), "vllm_kv_offload_load_speedup", "ratio_rate", ("fast", "slow"),
              _speedup),
    Rendering(("cpu_fill_seconds",), "kvoffload_cpu_fill_seconds", "ratio_rate", ("slow",),
              _per_sidecar("kvoffload_cpu_capacity_bytes",
                           lambda cfg, w: offload(cfg, "store", "bytes", w))),
    Rendering(("gpu_turnover_seconds",), "kvoffload_gpu_turnover_seconds", "ratio_rate",
              ("fast",), _per_sidecar("kvoffload_gpu_capacity_tokens", _written_tokens)),
    Rendering(("stored_bytes_since_start",), "vllm_kv_offload_store_bytes", "sum", (),
              _stored_since_start),
    Rendering(("cpu_fill_ratio_since_start",), "kvoffload_cpu_fill_since_start", "ratio", (),
              _fill_ratio_since_start),
    Rendering(("mean_ttft_seconds",), "vllm_time_to_first_token_seconds", "mean_rate",
              ("fast",), _mean("time_to_first_token_seconds")),
    Rendering(("mean_queue_seconds",), "vllm_request_queue_time_seconds", "mean_rate",
              ("fast",), _mean("request_queue_time_seconds")),
    Rendering(("gpu_kv_usage_ratio",), "vllm_kv_cache_usage_perc", "avg_over_time",
              ("fast",), _avg_gauge("kv_cache_usage_perc")),
    Rendering(("waiting_for_capacity",), "vllm_num_requests_waiting_for_capacity",
              "avg_over_time", ("fast",),
              _sum_gauge("num_requests_waiting_by_reason", 'reason="capacity"')),
    Rendering(("preemptions_per_second",), "vllm_num_preemptions", "rate", ("fast",),
              _counter_rate("num_preemptions_total")),
    Rendering(("allocation_failures_per_second",), "vllm_kv_offload_allocation_failure",
              "rate", ("fast",), _allocation_failures),
    Rendering(("prompt_tokens_per_second",), "vllm_prompt_tokens", "rate", ("fast", "slow"),
              _counter_rate("prompt_tokens_total")),
    Rendering((), "vllm_prefix_cache_queries", "rate", ("fast",),
              _counter_rate("prefix_cache_queries_total"),
              help="Prompt tokens looked up in the GPU prefix cache (traffic floor)."),
    Rendering((), "vllm_time_to_first_token_seconds", "fleet_mean_rate", ("slow",),
              _fleet_mean_ttft(True), labels=(("offloading", "on"),),
              help="Mean TTFT per model over its replicas with offloading (fleet A/B)."),
    Rendering((), "vllm_time_to_first_token_seconds", "fleet_mean_rate", ("slow",),
              _fleet_mean_ttft(False), labels=(("offloading", "off"),),
              help="Mean TTFT per model over its replicas without offloading (fleet A/B)."),
    Rendering((), "kvoffload_offload_ttft_effect_seconds", "fleet_rate", ("slow",),
              _fleet_effect,
              help="Fleet A/B: mean TTFT with a tier minus without, per model (negative = "
                   "faster); load is not matched."),
    *(
        Rendering((), "vllm_time_to_first_token_seconds", "histogram_quantile_rate", ("fast",),
                  _ttft_quantile(q), labels=(("quantile", q),),
                  help=f"TTFT {float(q):.0%} quantile.")
        for q in ("0.5", "0.9", "0.99")
    ),
)

# Figures of signals.FIGURES that PromQL cannot compute, and why (docs/rules.md says the same).
NOT_IN_PROMQL: dict[str, str] = {
    "cpu_capacity_tokens": "from kv_offload_config_info / cache_config_info label values; "
                           "PromQL cannot turn a label into a number: use the sidecar's "
                           "kvoffload_cpu_capacity_tokens",
    "gpu_capacity_tokens": "from cache_config_info label values (kv_cache_size_tokens, "
                           "num_gpu_blocks × block_size): use kvoffload_gpu_capacity_tokens",
    "cpu_capacity_bytes": "from kv_offload_config_info / kv_offloading_size label values: "
                          "use kvoffload_cpu_capacity_bytes",
    "gpu_capacity_bytes": "capacity tokens (labels) × KV bytes per token: "
                          "use kvoffload_gpu_capacity_bytes",
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
