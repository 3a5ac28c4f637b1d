"""The alert group: each alert declared once, with its name, `for`, severity, PromQL and texts.

Names and `for` defaults are read from here, kubernetes-mixin style, so an alert lives in one place.
Alerts read the recording rules: a threshold meets exactly the figure the dashboards show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from kvoffload.analysis.conditions import (
    ALLOCATION_FAILURES,
    ENABLE,
    OVERSIZED,
    STORES_WITHOUT_LOADS,
    TIER_NO_LARGER_THAN_GPU,
    TOO_SMALL,
)
from kvoffload.analysis.formula import (
    GATE_RECORD,
    by_labels,
    indent,
    paren,
    sidecar,
    sidecar_as_vllm,
    target_by,
    vllm,
)
from kvoffload.mixin.renderings import OFFLOAD_PRESENCE, helper_record, record_name
from kvoffload.mixin.settings import Settings

# Which of the config's severity labels (severity_info, severity_warning) an alert carries.
Severity = Literal["info", "warning"]
# The text every per-engine description starts with.
WHERE = "{{ $labels.model_name }} on {{ $labels.instance }}"


@dataclass(frozen=True)
class Alert:
    """One alert: its name, default `for`, severity and summary, and the builder of the rest.

    The config needs the former without a config; the alerts file is these, in this order."""

    name: str
    default_for: str
    severity: Severity
    summary: str
    build: Callable[[Settings], tuple[str, str]]  # cfg → (expr, description)

    def rule(self, cfg: Settings) -> dict[str, object]:
        """The alerting rule as Prometheus reads it, runbook link included."""
        expr, description = self.build(cfg)
        return {
            "alert": self.name,
            "expr": expr,
            "for": cfg.alert_for[self.name],
            "labels": {"severity": getattr(cfg, f"severity_{self.severity}")},
            "annotations": {
                "summary": self.summary,
                "description": description,
                "runbook_url": f"{cfg.runbook_url_base}#{self.name.lower()}",
            },
        }


_DECLARED: list[Alert] = []

Builder = Callable[[Settings], tuple[str, str]]


def alert(
    name: str, default_for: str, severity: Severity, summary: str
) -> Callable[[Builder], Builder]:
    """Declare the decorated builder as alert `name`; the declaration order is the file's.

    A name declared twice is refused here, since `alert_for` and the runbook anchors key on it.
    """
    if any(a.name == name for a in _DECLARED):
        raise ValueError(f"alert {name} is declared twice")

    def register(build: Builder) -> Builder:
        _DECLARED.append(Alert(name, default_for, severity, summary, build))
        return build

    return register


# -- text helpers ------------------------------------------------------------------------------
def _num(x: float) -> str:
    """A PromQL number literal without exponent noise (5e9 → 5000000000)."""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def _si(x: float, unit: str) -> str:
    """5e9, 'B/s' → '5 GB/s' for the human text of annotations."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:g} {prefix}{unit}"
    return f"{x:g} {unit}"


def _duration(seconds: float) -> str:
    """3600 → '1h': the largest whole unit, as a person writes a threshold."""
    for factor, suffix in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= factor and seconds % factor == 0:
            return f"{int(seconds // factor)}{suffix}"
    return f"{seconds:g}s"


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


# Traffic floors (min_*) keep idle servers quiet; a `reason` label tells an `or`'s branches apart.
def _reason(expr: str, reason: str) -> str:
    """Tag one branch of an alert so its description can say which condition fired."""
    return f'label_replace(\n{indent(expr)},\n  "reason", "{reason}", "", ""\n)'


def _on(cfg: Settings) -> str:
    return f"and on ({by_labels(cfg)})"


def _sidecar_size(cfg: Settings, verb: str) -> str:
    """Alert text naming the size the sidecar advises for the engine, or how to get one.

    It joins kvoffload_recommended_size_bytes in the template: the on-call gets the fix itself."""
    matchers = [cfg.sidecar_selector] if cfg.sidecar_selector else []
    matchers += [f'{cfg.sidecar_target_label}="%s"', 'model_name="%s"']
    selector = "kvoffload_recommended_size_bytes{" + ", ".join(matchers) + "}"
    query = selector.replace('"', '\\"')
    return (
        f'{{{{ with printf "{query}" $labels.instance $labels.model_name | query }}}}'
        f"{verb} --kv-offloading-size to {{{{ . | first | value | humanize1024 }}}}B "
        "per engine, as the kvoffload sidecar advises"
        f"{{{{ else }}}}{verb} --kv-offloading-size; run the kvoffload sidecar next to this "
        "engine for the size (`kvoffload serve`, or `kvoffload analyze --prometheus`)"
        "{{ end }}"
    )


def _sidecar_ttft(cfg: Settings) -> str:
    """Alert text with the mean TTFT change the sidecar predicts if its advice is applied.

    It joins kvoffload_recommended_ttft_change_seconds (estimate and basis) in the template.
    So the on-call weighs the change before making it."""
    matchers = [cfg.sidecar_selector] if cfg.sidecar_selector else []
    matchers += [f'{cfg.sidecar_target_label}="%s"', 'model_name="%s"', 'bound="estimate"']
    selector = "kvoffload_recommended_ttft_change_seconds{" + ", ".join(matchers) + "}"
    query = selector.replace('"', '\\"')
    return (
        f'{{{{ with printf "{query}" $labels.instance $labels.model_name | query }}}}'
        '; the sidecar predicts {{ . | first | value | printf "%+.3f" }} s of mean TTFT per '
        'request once applied (basis {{ . | first | label "basis" }}; negative = faster)'
        "{{ else }}; the sidecar's status page (/) gives the TTFT change it predicts, once "
        "it has one{{ end }}"
    )


# -- the advisor's rules, as alerts ------------------------------------------------------------
@alert(
    "KVOffloadRecommendEnable", "30m", "info", "KV offloading would likely help this vLLM engine."
)
def _recommend_enable(cfg: Settings) -> tuple[str, str]:
    """The advisor's `enable` condition (conditions.ENABLE) with a floor on prefix lookups.

    Its value is the GPU prefix hit ratio (ENABLE's first comparison)."""
    expr = "\n".join(
        (
            paren(ENABLE.promql(cfg)),
            _on(cfg),
            f"{helper_record('vllm_prefix_cache_queries', 'rate', cfg, 'fast')} > "
            f"{_num(cfg.min_prefix_query_tokens_per_second)}",
            f"unless on ({target_by(cfg)})",
            GATE_RECORD,
        )
    )
    return expr, (
        f"{WHERE} runs without KV offloading under GPU KV pressure (KV cache usage >= "
        f"{_pct(cfg.pressure_gpu_kv_usage)}, preemptions, requests waiting for capacity, or "
        f"prefixes evicted from the GPU within {_duration(cfg.reuse_horizon_seconds)}) while "
        "only {{ $value | humanizePercentage }} of the prompt tokens it looks up hit the "
        "GPU prefix cache: reusable prefixes are evicted before they come back. "
        f"{_sidecar_size(cfg, 'Set')}{_sidecar_ttft(cfg)}."
    )


@alert(
    "KVOffloadLowPrefixReuse",
    "30m",
    "warning",
    "KV offloading stores blocks that are almost never loaded back.",
)
def _low_prefix_reuse(cfg: Settings) -> tuple[str, str]:
    """The advisor's `store_threshold` condition (conditions.STORES_WITHOUT_LOADS) with a
    store-traffic floor.

    Quiet while the fill time is known to exceed the window, since loads may still come."""
    expr = "\n".join(
        (
            paren(STORES_WITHOUT_LOADS.promql(cfg)),
            _on(cfg),
            f"{record_name('store_rate_bytes_per_second', cfg, 'slow')} > "
            f"{_num(cfg.min_store_bytes_per_second)}",
        )
    )
    return expr, (
        f"{WHERE} loaded back {{{{ $value | humanizePercentage }}}} of the bytes it offloaded "
        f"to the CPU tier over the last {cfg.slow_window} (threshold "
        f"{_pct(cfg.low_reuse_ratio)}) while storing more than "
        f"{_si(cfg.min_store_bytes_per_second, 'B/s')}: the tier costs PCIe traffic and pinned "
        "memory for nothing. Set store_threshold: 2 in kv_connector_extra_config, or disable "
        f"offloading{_sidecar_ttft(cfg)}."
    )


@alert(
    "KVOffloadSlowerThanRecompute",
    "30m",
    "warning",
    "The CPU offload tier makes time-to-first-token worse than recomputing.",
)
def _slower_than_recompute(cfg: Settings) -> tuple[str, str]:
    """The sidecar's TTFT effect (a fit PromQL cannot do) over the threshold.

    It fires only where the low end of its range is a cost too, so never within the noise."""
    effect = sidecar_as_vllm(cfg, "kvoffload_offload_ttft_effect_seconds", 'bound="estimate"')
    low = sidecar_as_vllm(cfg, "kvoffload_offload_ttft_effect_seconds", 'bound="low"')
    expr = f"{effect}\n> {_num(cfg.min_ttft_saving_seconds)}\nand ignoring(bound)\n{low} > 0"
    return expr, (
        f"{WHERE}: with the CPU tier, mean TTFT is ~{{{{ $value | humanizeDuration }}}} per "
        f"request worse than recomputing would be (threshold "
        f"{cfg.min_ttft_saving_seconds * 1000:g} ms; the low end of its range, noise included, "
        "is a cost too), as the sidecar measures it: a reloaded "
        "request waits for the asynchronous load, and on this engine that costs more than "
        "recomputing its prefix. Disable offloading (see the sidecar's reasons)."
    )


@alert(
    "KVOffloadBufferTooSmall",
    "15m",
    "warning",
    "The CPU offload tier is too small to add prefix hits.",
)
def _buffer_too_small(cfg: Settings) -> tuple[str, str]:
    """The advisor's `grow` condition (conditions.TOO_SMALL), one `reason` per part."""
    # A part added to TOO_SMALL without a reason here fails generation (KeyError), not silently.
    reasons = {TIER_NO_LARGER_THAN_GPU: "capacity", ALLOCATION_FAILURES: "allocation_failures"}
    expr = "\nor\n".join(_reason(p.promql(cfg), reasons[p]) for p in TOO_SMALL.parts)
    return expr, (
        f'{WHERE}: {{{{ if eq $labels.reason "capacity" }}}}the CPU tier holds only '
        "{{ $value | humanizePercentage }} of the GPU KV cache's tokens, and it must be larger "
        'than the GPU cache to add hits{{ else }}{{ printf "%.2f" $value }} store attempts per '
        "second find no free CPU-tier slot, and those blocks are silently not offloaded"
        "{{ end }}. "
        f"{_sidecar_size(cfg, 'Grow')}, within the container's memory limit"
        f"{_sidecar_ttft(cfg)}."
    )


@alert(
    "KVOffloadBufferOversized",
    "1h",
    "info",
    "The CPU offload tier is much larger than the traffic needs.",
)
def _buffer_oversized(cfg: Settings) -> tuple[str, str]:
    """The advisor's `shrink` condition (conditions.OVERSIZED) with a floor on traffic.

    OVERSIZED means never full and slow to fill; the value is the fill time."""
    expr = "\n".join(
        (
            paren(OVERSIZED.promql(cfg)),
            _on(cfg),
            f"{record_name('prompt_tokens_per_second', cfg, 'slow')} > "
            f"{_num(cfg.min_prompt_tokens_per_second)}",
        )
    )
    return expr, (
        f"{WHERE} would take {{{{ $value | humanizeDuration }}}} to fill its CPU tier at the "
        f"store rate of the last {cfg.slow_window} (threshold "
        f"{_duration(cfg.oversized_fill_seconds)}) and has never been full: most of the "
        "pinned memory sits idle. "
        f"{_sidecar_size(cfg, 'Shrink')}{_sidecar_ttft(cfg)}."
    )


@alert(
    "KVOffloadTransferSlow",
    "15m",
    "warning",
    "KV offload loads run far below the host link's bandwidth.",
)
def _transfer_slow(cfg: Settings) -> tuple[str, str]:
    """Copy bandwidth under the floor while loads carry real traffic."""
    load_floor = (
        f"{helper_record('vllm_kv_offload_load_bytes', 'rate', cfg, 'slow')} > "
        f"{_num(cfg.min_load_bytes_per_second)}"
    )
    expr = "\n".join(
        (
            f"{record_name('load_gbps', cfg, 'slow')} < {_num(cfg.transfer_slow_bytes_per_second)}",
            _on(cfg),
            load_floor,
        )
    )
    return expr, (
        f"{WHERE} loads KV from the CPU tier at {{{{ $value | humanize }}}}B/s per worker over "
        f"the last {cfg.slow_window} (floor {_si(cfg.transfer_slow_bytes_per_second, 'B/s')}): "
        "check the PCIe link (generation, lanes, NUMA placement of the pinned buffer) and "
        "competing transfers."
    )


# -- blind spots: the series the figures need are missing ------------------------------------
def _configured_without_series(cfg: Settings) -> str:
    """Targets whose config says a tier size but that export no offload series."""
    tb = target_by(cfg)
    sized = vllm(cfg, "cache_config_info", 'kv_offloading_size!="None"')
    present = vllm(cfg, f"({OFFLOAD_PRESENCE})")
    return f"group by ({tb}) ({sized})\nunless on ({tb})\ngroup by ({tb}) ({present})"


@alert(
    "KVOffloadMetricsMissing",
    "15m",
    "warning",
    "The metrics KV offloading figures need are missing.",
)
def _metrics_missing(cfg: Settings) -> tuple[str, str]:
    """Four ways to be blind, one `reason` each.

    They are: no offload series, target down, no vLLM metrics, no target at all."""
    tb = target_by(cfg)
    up = f"up{{{cfg.vllm_selector}}}" if cfg.vllm_selector else "up"
    traffic = f"sum by ({tb}) (rate({vllm(cfg, 'prompt_tokens_total')}[{cfg.rate_window}])) > 0"
    missing = f"{paren(_configured_without_series(cfg))}\nand on ({tb})\n{traffic}"
    no_metrics = f"{up} == 1\nunless on ({tb})\n{vllm(cfg, 'prompt_tokens_total')}"
    expr = "\nor\n".join(
        (
            _reason(missing, "offload_series_missing"),
            _reason(f"{up} == 0", "target_down"),
            _reason(no_metrics, "no_vllm_metrics"),
            _reason(f"absent({up})", "target_absent"),
        )
    )
    return expr, (
        '{{ if eq $labels.reason "offload_series_missing" }}{{ $labels.instance }} has '
        "--kv-offloading-size set and serves traffic but exposes no vllm:kv_offload_* series"
        '{{ else if eq $labels.reason "target_down" }}Prometheus cannot scrape the vLLM '
        'target {{ $labels.instance }}{{ else if eq $labels.reason "no_vllm_metrics" }}'
        "{{ $labels.instance }} is up but exposes no vLLM engine metrics (is "
        "--disable-log-stats set?){{ else }}no scrape target matches the vLLM selector "
        f"{cfg.vllm_selector or '(none)'}{{{{ end }}}}: the offload rules, dashboards and "
        "alerts are blind there."
    )


# -- the sidecar and its host ------------------------------------------------------------------
@alert(
    "KVOffloadExporterTargetDown",
    "10m",
    "warning",
    "The kvoffload sidecar cannot scrape its vLLM target.",
)
def _exporter_target_down(cfg: Settings) -> tuple[str, str]:
    """The sidecar's own `up` for its vLLM target."""
    return f"{sidecar(cfg, 'kvoffload_up')} == 0", (
        "The kvoffload sidecar {{ $labels.instance }} fails to scrape {{ $labels.target }}: "
        "its figures and recommendation for that target are stale or absent. Its status page "
        "(/) and /api/v1/status show the error."
    )


@alert(
    "KVOffloadHostMemoryNearLimit",
    "5m",
    "warning",
    "The vLLM container is close to its memory limit: the next allocation may OOM-kill it.",
)
def _host_memory_near_limit(cfg: Settings) -> tuple[str, str]:
    """vLLM's unreclaimable memory over its container's limit, as the sidecar reads the cgroup."""
    held = sidecar(cfg, "kvoffload_host_memory_unreclaimable_bytes")
    limit = sidecar(cfg, "kvoffload_host_memory_limit_bytes")
    expr = f"{held}\n/\n({limit} > 0)\n> {_num(cfg.host_memory_near_limit_ratio)}"
    return expr, (
        "vLLM's container next to the sidecar {{ $labels.instance }} holds "
        "{{ $value | humanizePercentage }} of its memory limit in memory the kernel cannot "
        f"reclaim (threshold {_pct(cfg.host_memory_near_limit_ratio)}); the pinned CPU tier "
        "is part of it and cannot swap (vLLM 0.26.0 pins up to 2x --kv-offloading-size: "
        "kvoffload_host_memory_tier_footprint_bytes). Shrink --kv-offloading-size or raise "
        "the container's limit before the OOM killer restarts vLLM."
    )


@alert(
    "KVOffloadSidecarDown",
    "10m",
    "warning",
    "Prometheus cannot scrape the kvoffload sidecar: its alerts are silent.",
)
def _sidecar_down(cfg: Settings) -> tuple[str, str]:
    """The sidecar's scrape target down or absent: every alert reading its series goes quiet."""
    up = f"up{{{cfg.sidecar_selector}}}" if cfg.sidecar_selector else "up"
    expr = "\nor\n".join(
        (
            _reason(f"{up} == 0", "sidecar_down"),
            _reason(f"absent({up})", "sidecar_absent"),
        )
    )
    return expr, (
        '{{ if eq $labels.reason "sidecar_down" }}Prometheus cannot scrape the kvoffload '
        "sidecar {{ $labels.instance }}{{ else }}no scrape target matches the sidecar "
        f"selector {cfg.sidecar_selector or '(none)'}{{{{ end }}}}: the recommendation, "
        "the OOM check and every alert that reads the sidecar's series say nothing there."
    )


# The group, and what the config checks `alert_for` against, read from the declarations above.
ALERTS: tuple[Alert, ...] = tuple(_DECLARED)
ALERT_NAMES: tuple[str, ...] = tuple(a.name for a in ALERTS)
DEFAULT_FOR: dict[str, str] = {a.name: a.default_for for a in ALERTS}
