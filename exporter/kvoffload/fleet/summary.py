"""One view over many engines: what to change first, and what the changes add up to.

It counts the actions and the host memory they ask for, and puts engines in need order. Why: an
operator of many engines acts on the largest TTFT gain first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kvoffload.analysis.advisor import ACTIONS, GIB
from kvoffload.analysis.analyze import Settings, analyze_groups
from kvoffload.analysis.result import GroupAnalysis, JsonObject
from kvoffload.analysis.window import Window
from kvoffload.kvevents.state import TargetEvents

# Actions that ask the operator to do something.
CHANGES = frozenset({"enable", "grow", "shrink", "disable", "store_threshold"})


def _requests(group: GroupAnalysis) -> float:
    return group.ttft.requests if group.ttft is not None else 0.0


def ttft_gain_per_second(group: GroupAnalysis) -> float | None:
    """Seconds of TTFT the advice saves per second of traffic (negative: it costs).

    From the predicted change per request and the group's request rate."""
    change = group.recommendation.ttft_change_seconds
    if change is None or group.window_seconds <= 0:
        return None
    return -change * _requests(group) / group.window_seconds


def pinned_bytes_advised(group: GroupAnalysis) -> float:
    """The CPU tier (pinned host memory, all engines of the group) once the advice is applied."""
    rec = group.recommendation
    configured = group.figures.get("cpu_capacity_bytes") or 0.0
    if rec.insufficient_data:
        return configured if group.offloading else 0.0
    if rec.action in ("disable", "leave_off"):
        return 0.0
    if rec.action in ("enable", "grow", "shrink") and rec.kv_offloading_size_gib is not None:
        return rec.kv_offloading_size_gib * GIB * max(len(group.engines), 1)
    return configured if group.offloading else 0.0


def need_order(groups: list[GroupAnalysis]) -> list[GroupAnalysis]:
    """Changes first (largest TTFT gain first), then the rest, then too little data."""

    def key(group: GroupAnalysis) -> tuple[int, float, str, str]:
        rec = group.recommendation
        tier = 2 if rec.insufficient_data else 0 if rec.action in CHANGES else 1
        gain = ttft_gain_per_second(group)
        return (tier, -(gain or 0.0), group.instance, group.model_name)

    return sorted(groups, key=key)


@dataclass(frozen=True)
class FleetSummary:
    engines: int  # (instance, model_name) groups
    actions: dict[str, int]
    insufficient_data: int
    configured_pinned_bytes: float
    advised_pinned_bytes: float
    requests: float  # requests in the range, over the groups with a TTFT verdict
    # Request-weighted mean TTFT change per request if every change were applied (negative =
    # faster), and the TTFT seconds saved per second of traffic.
    mean_ttft_change_seconds: float | None
    ttft_seconds_saved_per_second: float
    # Changes advised without a TTFT estimate (no verdict yet): the mean above leaves them out,
    # and is None where no change has one (unknown, not zero).
    changes_without_ttft: int = 0

    def to_json(self) -> JsonObject:
        return {
            "engines": self.engines,
            "actions": self.actions,
            "insufficient_data": self.insufficient_data,
            "configured_pinned_bytes": self.configured_pinned_bytes,
            "advised_pinned_bytes": self.advised_pinned_bytes,
            "requests": self.requests,
            "mean_ttft_change_seconds": self.mean_ttft_change_seconds,
            "ttft_seconds_saved_per_second": self.ttft_seconds_saved_per_second,
            "changes_without_ttft": self.changes_without_ttft,
        }


# Counts engines per action, pinned host memory advised against configured, and the fleet's mean
# TTFT change per request.
def summarize(groups: list[GroupAnalysis]) -> FleetSummary:
    actions = dict.fromkeys(ACTIONS, 0)
    for g in groups:
        if not g.recommendation.insufficient_data:
            actions[g.recommendation.action] = actions.get(g.recommendation.action, 0) + 1
    requests = sum(_requests(g) for g in groups)
    changes = [g for g in groups if g.recommendation.action in CHANGES]
    known = [g for g in changes if g.recommendation.ttft_change_seconds is not None]
    weighted = sum((g.recommendation.ttft_change_seconds or 0.0) * _requests(g) for g in known)
    return FleetSummary(
        engines=len(groups),
        actions={k: v for k, v in actions.items() if v},
        insufficient_data=sum(1 for g in groups if g.recommendation.insufficient_data),
        configured_pinned_bytes=sum(
            g.figures.get("cpu_capacity_bytes") or 0.0 for g in groups if g.offloading
        ),
        advised_pinned_bytes=sum(pinned_bytes_advised(g) for g in groups),
        requests=requests,
        mean_ttft_change_seconds=weighted / requests if requests > 0 and known else None,
        ttft_seconds_saved_per_second=sum(ttft_gain_per_second(g) or 0.0 for g in known),
        changes_without_ttft=len(changes) - len(known),
    )


def analyze_fleet(
    window: Window,
    settings: Settings,
    lifetime: bool = False,
    left_out: Collection[str] = (),
    events: dict[str, TargetEvents] | None = None,
) -> tuple[list[GroupAnalysis], FleetSummary]:
    """Every group of the window in need order, with their summary: what `analyze` prints.

    Instances in `left_out` (their read failed) are excluded; `fleet.runs` does the same for
    Prometheus."""
    groups = need_order(
        [
            g
            for g in analyze_groups(window, settings, lifetime, events=events)
            if g.instance not in left_out
        ]
    )
    return groups, summarize(groups)
