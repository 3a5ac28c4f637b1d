"""The settings every rule, alert and dashboard reads (the mixin `_config`), checked when made.

Why apart from `config.MixinConfig`: the renderings and alerts read these fields, and the config
reads the renderings and alerts back (rule names, alert `for`s); this module reads neither."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace
from typing import Any, Self

from kvoffload.errors import InputError
from kvoffload.links import doc
from kvoffload.thresholds import Thresholds
from kvoffload.units import parse_duration

_ADVISOR = Thresholds()  # alert thresholds default to the sidecar advisor's, so both agree

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
    """`value` as PromQL label matchers to splice into `{__name__=~"…", <here>, …}`.

    Braces and a trailing comma are dropped, "" means none, anything else is a one-line InputError.
    A setting then cannot smuggle a selector or operator into every generated query."""
    # Refused: an unbalanced quote, a bare word, a selector or operator, `__name__`, Prometheus 3's
    # `or`.
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
class Settings(ABC):
    """Selectors, windows, thresholds and names of everything generated (the mixin `_config`).

    Users regenerate with their own values (`kvoffload generate`, `config.MixinConfig`).
    The defaults suit a `job="vllm"` scrape next to a `job="kvoffload"` sidecar."""

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
    # Each alert's `for`; `config.MixinConfig` fills in the alerts' own defaults and checks names.
    alert_for: dict[str, str] = field(default_factory=dict)
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
        self.check_alert_for()
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
        """The window a condition's `window_seconds` means in the alerts (conditions.py).

        It is the slow window, over which the reuse and fill-time alerts judge."""
        return self.slow_window_seconds

    def check_alert_for(self) -> None:
        """Each `alert_for` value is a Prometheus duration (the config checks the names too)."""
        for name, value in self.alert_for.items():
            if not _PROM_DURATION.match(value):
                raise InputError(f"alert_for[{name}]={value!r}: not a Prometheus duration")

    @abstractmethod
    def record_name(self, key: str) -> str:
        """The recording rule that renders figure `key` (analysis.scope.Scope asks for it)."""

    def with_overrides(self, **overrides: Any) -> Self:
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
