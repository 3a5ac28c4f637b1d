"""From a window of scrapes to the JSON contract shared by `analyze --json` and the sidecar."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.advisor import GIB, Recommendation, Thresholds, advise, refine_with_curve
from kvoffload.errors import InputError
from kvoffload.kvevents.evidence import event_evidence
from kvoffload.kvevents.state import TargetEvents
from kvoffload.parse import Exposition
from kvoffload.signals import FIGURE_KEYS, Context, compute_figures
from kvoffload.vllm import extract
from kvoffload.window import GroupKey, Window


@dataclass(frozen=True)
class Settings:
    world_size: int = 1
    memory_limit_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)


def analyze_window(
    window: Window,
    settings: Settings | None = None,
    lifetime: bool = False,
    events: dict[str, TargetEvents] | None = None,
    event_baselines: dict[GroupKey, dict[str, float]] | None = None,
) -> list[dict[str, object]]:
    """One JSON object per (instance, model_name) group that has at least two points.

    lifetime: the figures are totals since the engine started (one snapshot, no clock), so
    per-second rates are undefined and only the amount of traffic says whether it is enough.
    events: KV-event state per instance; the curve and exact figures join the group, and the
    advisor sizes from the curve. event_baselines: counter totals when the events started
    (live); without them the window's increases are the events' period (a recording).
    """
    settings = settings or Settings()
    groups: list[dict[str, object]] = []
    for group in window.groups():
        instance, model = group
        if not model:
            continue  # instance-level series only (cache_config_info); no model to judge
        static = window.static(group)
        delta = window.delta(group)
        labels = {"model_name": model, "instance": instance}
        offloading = static.offload_families
        if delta is None:
            groups.append({
                "labels": labels, "offloading": offloading, "window_seconds": 0.0,
                "figures": dict.fromkeys(_figure_keys()),
                "recommendation": Recommendation(
                    "keep" if offloading else "leave_off",
                    reasons=["waiting for a second scrape to compute rates"],
                ).to_json(),
                "naming": static.naming, "engines": sorted(static.engines),
            })
            continue
        ctx = Context(delta, static, settings.world_size, settings.kv_bytes_per_token)
        figures = compute_figures(ctx)
        rec = advise(
            figures,
            offloading,
            delta.seconds,
            settings.memory_limit_bytes,
            settings.thresholds,
            lifetime=lifetime,
            prompt_tokens=ctx.inc("prompt_tokens"),
            engines=len(static.engines),
        )
        entry: dict[str, object] = {
            "labels": labels,
            "offloading": offloading,
            "window_seconds": delta.seconds,
            "figures": figures,
            "recommendation": rec.to_json(),
            "naming": static.naming,
            "engines": sorted(static.engines),
        }
        target_events = (events or {}).get(instance)
        if target_events is not None and not _events_belong_to(window, group, offloading):
            target_events = None
        if target_events is not None and target_events.messages():
            missed = _missed_tokens(window, group, ctx, event_baselines)
            ev = event_evidence(target_events, static, figures, missed)
            entry["kv_events"] = ev.json
            if ev.curve is not None:
                curve = ev.curve
                entry["curve"] = [p.to_json() for p in curve.points]
                gpu = figures.get("gpu_capacity_bytes")
                engines = max(len(static.engines), 1)
                rec = refine_with_curve(
                    rec, figures, offloading, curve.right_size_bytes,
                    curve.achievable_hit_ratio,
                    lambda size, c=curve, e=target_events: c.at(size, e),
                    ev.current_cpu_bytes_per_engine, gpu / engines if gpu else None,
                    settings.memory_limit_bytes, settings.thresholds, engines)
                entry["recommendation"] = rec.to_json()
                size = rec.kv_offloading_size_gib
                entry["predicted_offload_hit_ratio"] = (
                    curve.at(size * GIB, target_events) if size is not None
                    else ev.json.get("predicted_offload_hit_ratio_current"))
        groups.append(entry)
    return groups


def _events_belong_to(window: Window, group: GroupKey, offloading: bool) -> bool:
    """KV events name no model: they belong to the instance's only model, or, when one process
    serves several, to its only model with offloading on."""
    siblings = [g for g in window.groups() if g[0] == group[0] and g[1]]
    if len(siblings) <= 1:
        return True
    with_offload = [g for g in siblings if window.static(g).offload_families]
    return offloading and len(with_offload) == 1


def _missed_tokens(window: Window, group: GroupKey, ctx: Context,
                   baselines: dict[GroupKey, dict[str, float]] | None) -> float | None:
    """GPU-missed prompt tokens over the events' period, from the counters."""
    if baselines is None:
        inc = ctx.inc
    else:
        base = baselines.get(group)
        latest = window.latest(group)
        if base is None or latest is None:
            return None

        def inc(*keys: str) -> float:
            return sum(latest.get(k, 0.0) - base.get(k, 0.0) for k in keys)

    external = inc("ext_queries")
    if external > 0:
        return external
    missed = inc("prefix_queries") - inc("prefix_hits")
    return missed if missed > 0 else None


def _figure_keys() -> tuple[str, ...]:
    return FIGURE_KEYS


def window_from_expositions(
    expositions: Iterable[Exposition],
    window_seconds: float | None = None,
    instance: str = "",
) -> tuple[Window, int, bool]:
    """Feed a stream of scrapes into a window. Returns (window, scrapes, lifetime).

    A single scrape (a plain /metrics snapshot) has no earlier point to subtract: its counters
    are taken from zero at the process start (`lifetime` = True); without a timestamp its
    time span is unknown, so per-second figures stay undefined.
    """
    it = iter(expositions)
    first = next(it, None)
    if first is None:
        raise InputError("the input holds no samples")
    second = next(it, None)
    lifetime = second is None
    window = Window(None if lifetime else window_seconds, origin_zero=lifetime)
    count = 0
    for expo in itertools.chain([first], [second] if second is not None else [], it):
        ex = extract(expo, expo.timestamp or 0.0, instance)
        window.update(ex)
        count += 1
    return window, count, lifetime
