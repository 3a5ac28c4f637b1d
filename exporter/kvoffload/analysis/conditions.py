"""Advisor rules as conditions on figures, defined once: the advisor evaluates them, the alerts
render them.

A threshold is named, not copied: Thresholds and MixinConfig share the name. So the sidecar
judges at the value the alert fires at. An undefined figure satisfies no comparison in either
rendering.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvoffload.analysis.formula import binop, by_labels, indent, paren, sidecar

if TYPE_CHECKING:
    from kvoffload.analysis.scope import Scope

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<": operator.lt,
    "<=": operator.le,
}


def _num(value: float) -> str:
    return f"{value:g}"


class Condition:
    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        raise NotImplementedError

    def promql(self, cfg: Scope) -> str:
        raise NotImplementedError

    composite = True


@dataclass(frozen=True)
class Compare(Condition):
    """figure <op> threshold; `threshold` names a field of Thresholds and MixinConfig, or is a
    constant. PromQL reads the figure's rule at its first window."""

    figure: str
    op: str
    threshold: str | float
    composite = False

    def limit(self, thresholds: object) -> float:
        if isinstance(self.threshold, str):
            return float(getattr(thresholds, self.threshold))
        return float(self.threshold)

    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        value = figures.get(self.figure)
        return value is not None and _OPS[self.op](value, self.limit(thresholds))

    def promql(self, cfg: Scope) -> str:
        return f"{cfg.record_name(self.figure)} {self.op} {_num(self.limit(cfg))}"


@dataclass(frozen=True)
class AtMost(Condition):
    """figure ≤ other figure.

    PromQL compares the two capacity gauges as a ratio ≤ 1, joined to the vLLM labels. So the
    alert's value is the ratio.
    """

    figure: str
    other: str
    composite = False

    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        a, b = figures.get(self.figure), figures.get(self.other)
        return a is not None and b is not None and a <= b

    def promql(self, cfg: Scope) -> str:
        from kvoffload.analysis.signals import FIGURES_BY_KEY  # signals imports the advisor

        ratio = binop(
            sidecar(cfg, FIGURES_BY_KEY[self.figure].metric),
            "/",
            sidecar(cfg, FIGURES_BY_KEY[self.other].metric),
        )
        return (
            f'label_replace(\n{indent(ratio + " <= 1")},\n  "instance", "$1", '
            f'"{cfg.sidecar_target_label}", "(.+)"\n)'
        )


@dataclass(frozen=True)
class AnyOf(Condition):
    parts: tuple[Condition, ...]

    def __init__(self, *parts: Condition) -> None:
        object.__setattr__(self, "parts", parts)

    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        return any(p.holds(figures, thresholds) for p in self.parts)

    def promql(self, cfg: Scope) -> str:
        return "\nor\n".join(_operand(p, cfg) for p in self.parts)


@dataclass(frozen=True)
class AllOf(Condition):
    parts: tuple[Condition, ...]

    def __init__(self, *parts: Condition) -> None:
        object.__setattr__(self, "parts", parts)

    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        return all(p.holds(figures, thresholds) for p in self.parts)

    def promql(self, cfg: Scope) -> str:
        return f"\nand on ({by_labels(cfg)})\n".join(_operand(p, cfg) for p in self.parts)


@dataclass(frozen=True)
class Unless(Condition):
    """`kept` holds and `excluded` does not, as PromQL `unless` (an absent right side excludes
    nothing)."""

    kept: Condition
    excluded: Condition

    def holds(self, figures: Mapping[str, float | None], thresholds: object) -> bool:
        return self.kept.holds(figures, thresholds) and not self.excluded.holds(figures, thresholds)

    def promql(self, cfg: Scope) -> str:
        return (
            f"{_operand(self.kept, cfg)}\nunless on ({by_labels(cfg)})\n"
            f"{_operand(self.excluded, cfg)}"
        )


class Limits:
    """Thresholds plus the window judged, which is not a setting: the advisor's window or
    MixinConfig's slow one."""

    def __init__(self, thresholds: object, **extra: float) -> None:
        self._thresholds = thresholds
        self._extra = extra

    def __getattr__(self, name: str) -> object:
        if name in self._extra:
            return self._extra[name]
        return getattr(self._thresholds, name)


def _operand(c: Condition, cfg: Scope) -> str:
    text = c.promql(cfg)
    return paren(text) if c.composite else text


# -- the advisor's rules ------------------------------------------------------------------------
# GPU KV pressure: the cache is full, requests are preempted or wait for capacity, or a prefix
# does not survive on the GPU until it comes back (turnover under the reuse horizon).
GPU_PRESSURE = AnyOf(
    Compare("gpu_kv_usage_ratio", ">=", "pressure_gpu_kv_usage"),
    Compare("preemptions_per_second", ">", 0.0),
    Compare("waiting_for_capacity", ">", 0.0),
    Compare("gpu_turnover_seconds", "<", "reuse_horizon_seconds"),
)
# Some prefix reuse exists to win back...
REUSE_EVIDENCE = Compare("gpu_prefix_hit_ratio", ">=", "min_reuse_evidence_ratio")
# ... that the GPU prefix cache alone does not serve.
GPU_MISSES_REUSE = Compare("gpu_prefix_hit_ratio", "<", "low_gpu_prefix_hit_ratio")
# Offloading on, the tier barely read back: stores without loads ...
LOW_REUSE = Compare("reuse_ratio", "<", "low_reuse_ratio")
# ... over longer than the tier keeps a block (loads could still come while the window is
# shorter than the fill time): advisor `store_threshold`, alert KVOffloadLowPrefixReuse.
STORES_WITHOUT_LOADS = Unless(LOW_REUSE, Compare("cpu_fill_seconds", ">", "window_seconds"))
# Never full, and it would take longer than `oversized_fill_seconds` to fill at the current
# store rate: advisor `shrink` (when the size it computes is smaller), alert
# KVOffloadBufferOversized. The fill time comes first: the alert's text reads its value.
OVERSIZED = AllOf(
    Compare("cpu_fill_seconds", ">", "oversized_fill_seconds"),
    Compare("cpu_fill_ratio_since_start", "<", 1.0),
)
# The tier cannot add hits: it holds no more tokens than the GPU cache, or stores find no free
# slot (advisor `grow`, alert KVOffloadBufferTooSmall, which tags each part with a reason).
TIER_NO_LARGER_THAN_GPU = AtMost("cpu_capacity_tokens", "gpu_capacity_tokens")
ALLOCATION_FAILURES = Compare(
    "allocation_failures_per_second", ">", "min_allocation_failures_per_second"
)
TOO_SMALL = AnyOf(TIER_NO_LARGER_THAN_GPU, ALLOCATION_FAILURES)
# Offloading off: enable it (advisor `enable`; alert KVOffloadRecommendEnable). The hit ratio
# comes first: PromQL's `and` keeps the left side's value, which the alert's text reads.
ENABLE = AllOf(GPU_MISSES_REUSE, REUSE_EVIDENCE, GPU_PRESSURE)
