"""Turns a window of scrapes into each group's typed analysis (`result.GroupAnalysis`).

Its JSON is the contract of `analyze --json` and the sidecar.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from copy import deepcopy
from dataclasses import dataclass, field, replace

from kvoffload import recording
from kvoffload.analysis import tiering, ttft
from kvoffload.analysis.advisor import (
    GIB,
    Counters,
    CurveEvidence,
    Evidence,
    Measured,
    Recommendation,
    TtftEvidence,
    decide,
)
from kvoffload.analysis.beforeafter import before_after
from kvoffload.analysis.context import Context
from kvoffload.analysis.evidence import EventEvidence, event_evidence, provisional_reasons
from kvoffload.analysis.knobs import WhatIfRows
from kvoffload.analysis.replicas import replica_effects
from kvoffload.analysis.result import (
    TTFT_EFFECT_FIGURE,
    GroupAnalysis,
    ReuseHistogram,
    TtftVerdict,
)
from kvoffload.analysis.signals import FIGURE_KEYS, compute_figures, per_tier_figures
from kvoffload.analysis.timeline import TierTimeline
from kvoffload.analysis.window import GroupKey, GroupStatic, Window
from kvoffload.errors import InputError
from kvoffload.ingest.catalog import Extract, extract
from kvoffload.ingest.hostmemory import HostMemory
from kvoffload.ingest.parse import Exposition
from kvoffload.kvevents.curve import Curve
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.whatif import (
    DEFAULT_MAX_BLOCKS,
    live_whatif,
    source_of,
    whatif_for_file,
)
from kvoffload.thresholds import Thresholds

log = logging.getLogger("kvoffload")


@dataclass(frozen=True)
class Settings:
    world_size: int = 1
    memory_limit_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    # The container's memory as the sidecar last read it (its OOM check); None in analyze.
    host_memory: HostMemory | None = None


def analyze_window(
    window: Window,
    settings: Settings | None = None,
    lifetime: bool = False,
    events: dict[str, TargetEvents] | None = None,
    event_baselines: dict[GroupKey, dict[str, float]] | None = None,
) -> list[dict[str, object]]:
    """The JSON contract (`analyze --json`, /api/v1/status): analyze_groups, serialised."""
    return [
        g.to_json() for g in analyze_groups(window, settings, lifetime, events, event_baselines)
    ]


def analyze_groups(
    window: Window,
    settings: Settings | None = None,
    lifetime: bool = False,
    events: dict[str, TargetEvents] | None = None,
    event_baselines: dict[GroupKey, dict[str, float]] | None = None,
    replicas: bool = True,
) -> list[GroupAnalysis]:
    """One analysis per (instance, model_name) group with at least two points.

    `lifetime`: the figures are totals since the engine started, so rates are undefined.
    `events`: KV-event state per instance; its curve joins the group and sizes the advice.
    `event_baselines`: counter totals when the events started (live); without them the window is
    the events' period. `replicas=False` skips the replica comparison, for a caller that compares
    parts later.
    """
    settings = settings or Settings()
    groups: list[GroupAnalysis] = []
    for group in window.groups():
        entry = analyze_group(window, group, settings, lifetime, events, event_baselines)
        if entry is not None:
            groups.append(entry)
    if replicas:
        add_replica_evidence(groups, settings)
    add_before_after(window, groups, settings)
    return groups


def add_before_after(
    window: Window, groups: list[GroupAnalysis], settings: Settings, copy_changed: bool = False
) -> None:
    """Re-decides the advice from measured TTFT before and after a tier change in the window (basis
    "before_after"). It applies only when the load matched; otherwise the reasons say why."""
    if window.timeline is None:
        return
    for i, entry in enumerate(groups):
        ab = before_after(window.timeline.segments(entry.key))
        if ab is None or entry.ttft is None:
            continue
        if copy_changed:
            entry = groups[i] = replace(
                entry, ttft=replace(entry.ttft), recommendation=deepcopy(entry.recommendation)
            )
        assert entry.ttft is not None
        entry.ttft.before_after = ab
        if ab.matched:
            measured = Measured(ab.effect, ab.mean_ttft_without_seconds, "before_after", ab.seen())
            _decide_with(entry, settings, measured=(measured,))
        else:
            note = (
                f"before and after the tier changed ({ab.before} → {ab.after}) the load "
                f"differed ({'; '.join(ab.mismatch)}): not compared"
            )
            _decide_with(entry, settings, notes=(note,))


def analyze_group(
    window: Window,
    group: GroupKey,
    settings: Settings,
    lifetime: bool = False,
    events: dict[str, TargetEvents] | None = None,
    event_baselines: dict[GroupKey, dict[str, float]] | None = None,
) -> GroupAnalysis | None:
    """One group of `analyze_groups`, without the replica comparison. events: its instance's KV
    events (None for an instance-level group)."""
    if not group[1]:
        return None  # instance-level series only (cache_config_info); no model to judge
    entry, ctx = _group_entry(window, group, settings, lifetime)
    if ctx is None or entry.evidence is None:
        return entry
    target_events = (events or {}).get(group[0])
    ev = entry.evidence
    found = _curve_evidence(entry, window, group, ctx, target_events, event_baselines, settings)
    if found is not None:
        ev = replace(ev, curve=found.curve, warnings=(*ev.warnings, *found.warnings))
    # The size the counters and the curve propose: the what-ifs and the prediction run there.
    proposed = decide(ev, settings.thresholds).kv_offloading_size_gib
    if found is not None:
        ev = replace(ev, whatif=_event_whatif(entry, found, proposed))
    ev = replace(ev, ttft=_ttft_evidence(entry, ctx, settings, ev.curve, proposed))
    entry.evidence = ev
    entry.recommendation = decide(ev, settings.thresholds)
    return entry


def predicted_effect(
    window: Window,
    group: GroupKey,
    settings: Settings,
    size_bytes: float,
    events: TargetEvents | None = None,
) -> ttft.Effect | None:
    """The TTFT model's effect of a `size_bytes` tier per engine against none, for one group. It
    uses the event curve's hit ratio, or without events the best case; what-ifs and the accuracy
    benchmark use it."""
    entry, ctx = _group_entry(window, group, settings, False)
    if ctx is None:
        return None
    found = _curve_evidence(entry, window, group, ctx, events, None, settings)
    obs = ttft.observe(ctx, entry.figures.get("kv_bytes_per_token"))
    if obs is None:
        return None
    hit = found.curve.hit_at(size_bytes) if found is not None else 1.0
    return ttft.predict(obs, hit * obs.missed_tokens, ttft_constants(settings.thresholds))


def _curve_evidence(
    entry: GroupAnalysis,
    window: Window,
    group: GroupKey,
    ctx: Context,
    events: TargetEvents | None,
    baselines: dict[GroupKey, dict[str, float]] | None,
    settings: Settings,
) -> _EventFound | None:
    """Adds the KV-event evidence to the entry. Returns it, or None without this group's events or
    curve."""
    if events is None or not events.messages():
        return None
    if not _events_belong_to(window, group, entry.offloading):
        return None
    missed = _missed_tokens(window, group, ctx, baselines)
    return _add_event_evidence(entry, window.static(group), events, missed, settings)


def add_replica_evidence(
    groups: list[GroupAnalysis], settings: Settings, copy_changed: bool = False
) -> None:
    """Compares replicas of one model with and without a tier; their measured difference decides
    (basis "replicas"). `copy_changed`: entries are shared with the sidecar, so a changed entry is
    replaced in `groups` by a copy."""
    effects = replica_effects(groups)
    for i, entry in enumerate(groups):
        ab = effects.get(entry.key)
        verdict = entry.ttft
        if ab is None or verdict is None:
            continue
        if copy_changed:
            verdict = replace(verdict)
            entry = groups[i] = replace(
                entry, ttft=verdict, recommendation=deepcopy(entry.recommendation)
            )
        verdict.replicas = ab
        measured = Measured.replicas(ab, entry.offloading, verdict.mean_ttft_seconds)
        _decide_with(entry, settings, measured=(measured,))


def _decide_with(
    entry: GroupAnalysis,
    settings: Settings,
    measured: tuple[Measured, ...] = (),
    notes: tuple[str, ...] = (),
) -> None:
    """Re-decides the advice from all the entry's evidence plus later evidence (an A/B, or why
    none). Why: nothing patches the earlier advice."""
    ev = entry.evidence
    if ev is None:
        return
    entry.evidence = replace(ev, measured=(*ev.measured, *measured), notes=(*ev.notes, *notes))
    entry.recommendation = decide(entry.evidence, settings.thresholds)


def _group_entry(
    window: Window, group: GroupKey, settings: Settings, lifetime: bool
) -> tuple[GroupAnalysis, Context | None]:
    """The figures and the counter-based advice of one group."""
    instance, model = group
    static = window.static(group)
    delta = window.delta(group)
    offloading = static.offload_families
    if delta is None:
        return GroupAnalysis(
            instance,
            model,
            offloading,
            0.0,
            static.naming,
            sorted(static.engines),
            dict.fromkeys(FIGURE_KEYS),
            Recommendation(
                "keep" if offloading else "leave_off",
                reasons=["waiting for a second scrape to compute rates"],
                insufficient_data=True,
            ),
        ), None
    ctx = Context(delta, static, settings.world_size, settings.kv_bytes_per_token)
    figures = compute_figures(ctx)
    counters = Counters(
        figures,
        offloading,
        delta.seconds,
        settings.memory_limit_bytes,
        lifetime=lifetime,
        prompt_tokens=ctx.inc("prompt_tokens"),
        engines=len(static.engines),
        requests=ctx.inc("ttft_count") if ctx.has("ttft_count") else None,
        host=settings.host_memory,
    )
    evidence = Evidence(counters, warnings=tuple(window.anomalies(group)))
    entry = GroupAnalysis(
        instance,
        model,
        offloading,
        delta.seconds,
        static.naming,
        sorted(static.engines),
        figures,
        decide(evidence, settings.thresholds),
        evidence=evidence,
        tiers=per_tier_figures(ctx) or None,
    )
    return entry, ctx


# Below this many sampled blocks per engine the sampled curve is coarse (docs/sizing.md).
MIN_SAMPLED_BLOCKS = 1000


def _ttft_evidence(
    entry: GroupAnalysis,
    ctx: Context,
    settings: Settings,
    curve: CurveEvidence | None,
    proposed: float | None,
) -> TtftEvidence | None:
    """Adds the TTFT effect (analysis.ttft), now and at any size, to the figures and verdict.
    Returns it as evidence."""
    figures = entry.figures
    obs = ttft.observe(ctx, figures.get("kv_bytes_per_token"))
    figures[TTFT_EFFECT_FIGURE] = None
    if obs is None:
        return None
    k = ttft_constants(settings.thresholds)
    now = ttft.effect_now(obs, k) if entry.offloading else None
    effect_at = _EffectAt(obs, k, curve)
    effect_with = _EffectWith(obs, k)
    if now is not None:
        figures[TTFT_EFFECT_FIGURE] = now.seconds
    capacity = figures.get("cpu_capacity_bytes")
    engines = max(len(ctx.static.engines), 1)
    predicted = effect_at(proposed * GIB) if curve is not None and proposed is not None else None
    entry.ttft = TtftVerdict(
        obs.mean_ttft,
        obs.mean_queue,
        obs.mean_prefill,
        obs.requests,
        obs.prompt_tokens,
        obs.cost,
        now,
        predicted,
        proposed if predicted is not None else None,
    )
    return TtftEvidence(
        obs.mean_ttft,
        now,
        effect_at,
        figures.get("offload_hit_ratio"),
        best_case_only=curve is None,
        current_bytes=capacity / engines if capacity else None,
        effect_with=effect_with,
        tier_below=tiering.has_secondary_tier(figures),
    )


class _HitAt:
    """The curve's hit ratio at a size per engine, frozen at this analysis. Why: a later decision
    reads the same numbers; a class so the evidence pickles."""

    def __init__(self, curve: Curve, events: TargetEvents) -> None:
        self.curve, self.events = curve, events
        self.hits: dict[float, float] = {}

    def __call__(self, size: float) -> float:
        if size not in self.hits:
            self.hits[size] = self.curve.at(size, self.events)
        return self.hits[size]


@dataclass(frozen=True)
class _EffectAt:
    """The TTFT model's effect of a sized tier against none: at the curve's hit ratio, else the best
    case."""

    obs: ttft.Observed
    k: ttft.Constants
    curve: CurveEvidence | None

    def __call__(self, size_bytes: float) -> ttft.Effect | None:
        hit = self.curve.hit_at(size_bytes) if self.curve is not None else 1.0
        return ttft.predict(self.obs, hit * self.obs.missed_tokens, self.k)


@dataclass(frozen=True)
class _EffectWith:
    """The TTFT model's effect of a tier reloading and storing given shares (knobs' what-ifs)."""

    obs: ttft.Observed
    k: ttft.Constants

    def __call__(self, hit_ratio: float, stored_share: float) -> ttft.Effect | None:
        return ttft.predict(self.obs, hit_ratio * self.obs.missed_tokens, self.k, stored_share)


def ttft_constants(t: Thresholds) -> ttft.Constants:
    """The TTFT model's constants, from the thresholds (docs/advisor.md)."""
    return ttft.Constants(
        t.store_critical_bytes_per_second,
        t.idle_reload_step_seconds,
        t.ttft_run_to_run_seconds,
        t.assumed_load_bytes_per_second,
    )


@dataclass(frozen=True)
class _EventFound:
    """What the KV events gave one group: the curve as evidence, its warnings, and the pieces the
    what-ifs replay."""

    curve: CurveEvidence
    warnings: list[str]
    events: TargetEvents
    info: EventEvidence
    raw: Curve


def _add_event_evidence(
    entry: GroupAnalysis,
    static: GroupStatic,
    events: TargetEvents,
    missed: float | None,
    settings: Settings,
) -> _EventFound | None:
    """Adds the curve and exact figures to the entry. Returns the curve as evidence, with warnings
    for a provisional or sampled curve."""
    figures = entry.figures
    ev = event_evidence(events, static, figures, missed)
    entry.kv_events = ev.json
    curve = ev.curve
    if curve is None:
        return None
    entry.curve = [p.to_json() for p in curve.points]
    if ev.bytes_per_block and events.block_size:
        # The histogram at the curve's sizes: computed here, exported as is by /metrics.
        total, finite = events.histogram_totals()
        entry.reuse_histogram = ReuseHistogram(
            (
                *(
                    (p.cpu_bytes, events.hit_tokens(p.cpu_bytes, ev.bytes_per_block))
                    for p in curve.points
                ),
                (math.inf, total),
            ),
            finite * ev.bytes_per_block,
        )
    engines = max(len(static.engines), 1)
    gpu = figures.get("gpu_capacity_bytes")
    evidence = CurveEvidence(
        curve.right_size_bytes,
        curve.achievable_hit_ratio,
        _HitAt(curve, events),
        ev.current_cpu_bytes_per_engine,
        gpu / engines if gpu else None,
    )
    t = settings.thresholds
    provisional = provisional_reasons(
        events,
        gpu / engines / ev.bytes_per_block if gpu and ev.bytes_per_block else None,
        t.min_gpu_turnovers,
        t.max_first_touch_gap_ratio,
    )
    ev.json["provisional"] = bool(provisional)
    ev.json["provisional_reasons"] = provisional
    warnings = [f"provisional: {reason}" for reason in provisional]
    tracked = events.tracked_blocks()
    if events.sample_rate_now() < 1.0 and tracked < MIN_SAMPLED_BLOCKS:
        warnings.append(
            f"the curve comes from a sample of {tracked:,} blocks per engine (rate "
            f"{events.sample_rate_now():.3g}): on the simulator, samples of a few dozen blocks "
            "erred by up to 0.13 in hit ratio, a few thousand by 0.01; raise "
            "--kv-events-sample-rate or --kv-events-sample-budget"
        )
    return _EventFound(evidence, warnings, events, ev, curve)


def _event_whatif(
    entry: GroupAnalysis, found: _EventFound, proposed: float | None
) -> WhatIfRows | None:
    """Adds the predicted hit ratio at the proposed (else current) size to the entry. For events
    from a file it also adds store_threshold and eviction what-ifs; returns those rows as knob
    evidence."""
    events, ev, curve = found.events, found.info, found.raw
    current = ev.json.get("predicted_offload_hit_ratio_current")
    entry.predicted_offload_hit_ratio = (
        curve.at(proposed * GIB, events)
        if proposed is not None
        else float(current)
        if isinstance(current, float | int)
        else None
    )
    path = source_of(events)
    if not ev.bytes_per_block or not events.block_size:
        return None
    if path is None:  # live: simulated as the lookups arrive, at the current size
        live = live_whatif(
            events, ev.bytes_per_block, ev.current_cpu_bytes_per_engine or 0.0, time.time()
        )
        if live is None:
            return None
        ev.json["whatif"] = live.to_json()
        return _with_tier_below(entry, ev, WhatIfRows.from_json(ev.json["whatif"]), proposed)
    advised = proposed * GIB if proposed is not None else 0.0
    sizes = {"current": ev.current_cpu_bytes_per_engine or 0.0, "advised": advised}
    top = 4 * max(sizes.values())
    whatif = whatif_for_file(
        path,
        ev.bytes_per_block,
        events.block_size,
        sizes,
        tuple(p.cpu_bytes for p in curve.points if p.cpu_bytes <= top),
        curve.missed_tokens,
        events.sample_budget or DEFAULT_MAX_BLOCKS,
    ).to_json()
    ev.json["whatif"] = whatif
    return _with_tier_below(entry, ev, WhatIfRows.from_json(whatif), proposed)


def _with_tier_below(
    entry: GroupAnalysis, ev: EventEvidence, rows: WhatIfRows | None, proposed: float | None
) -> WhatIfRows | None:
    """On a server with a secondary tier, the current size's prediction counts the tier below too.

    Why: its hits reach the GPU through the CPU tier and count as offload hits, so the CPU-alone
    curve would compare 0 against the 0.6 such a server measures.
    """
    tier = rows.tiers.get("current") if rows is not None else None
    if tier is not None and tiering.has_secondary_tier(entry.figures):
        ev.json["predicted_offload_hit_ratio_current_with_tier"] = tier.hit_ratio
        if proposed is None:
            entry.predicted_offload_hit_ratio = tier.hit_ratio
    return rows


def _events_belong_to(window: Window, group: GroupKey, offloading: bool) -> bool:
    """Whether KV events (which name no model) belong to this group. They go to the instance's only
    model, or its only model with offloading on."""
    siblings = [g for g in window.groups() if g[0] == group[0] and g[1]]
    if len(siblings) <= 1:
        return True
    with_offload = [g for g in siblings if window.static(g).offload_families]
    return offloading and len(with_offload) == 1


def _missed_tokens(
    window: Window,
    group: GroupKey,
    ctx: Context,
    baselines: dict[GroupKey, dict[str, float]] | None,
) -> float | None:
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


def window_from_expositions(
    expositions: Iterable[Exposition],
    window_seconds: float | None = None,
    instance: str = "",
) -> tuple[Window, int, bool]:
    """Feeds a stream of scrapes into a window. Returns (window, scrapes, lifetime).

    A single scrape has no earlier point, so its counters count from process start (`lifetime`
    True). Without a timestamp its span is unknown and rates stay undefined.
    """
    return window_from_extracts(
        (extract(expo, expo.timestamp or 0.0, instance) for expo in expositions), window_seconds
    )


def window_from_recording(
    path: str,
    window_seconds: float | None = None,
    report: Callable[[int | None], None] | None = None,
) -> tuple[Window, int, bool]:
    """window_from_expositions of a recording file, read by `recording.read`."""
    return recording.read(
        path, lambda scrapes: window_from_extracts(scrapes, window_seconds), report
    )


def window_from_extracts(
    extracts: Iterable[Extract], window_seconds: float | None = None
) -> tuple[Window, int, bool]:
    """window_from_expositions for scrapes already in the catalog's terms (from the Prometheus
    reader)."""
    skipped = [0]

    def believable(stream: Iterable[Extract]) -> Iterator[Extract]:
        for ex in stream:
            if not _believable(ex.timestamp):
                skipped[0] += 1  # a NaN or far-off time would make every window nonsense
                continue
            yield ex  # (the samples' own stamps are not read: the scrape's time is)

    it = believable(extracts)
    first = next(it, None)
    if first is None:
        raise InputError("the input holds no samples" + _skipped_note(skipped[0]))
    second = next(it, None)
    lifetime = second is None
    window = Window(
        None if lifetime else window_seconds, origin_zero=lifetime, timeline=TierTimeline()
    )
    count = 0
    for ex in itertools.chain([first], [second] if second is not None else [], it):
        window.update(ex)
        count += 1
    if skipped[0]:
        log.warning("%s", _skipped_note(skipped[0]).strip(" ();"))
    return window, count, lifetime


# Later than this (year 5138) a recording's timestamp is garbage, not a time.
MAX_TIMESTAMP = 1e11


def _believable(ts: float) -> bool:
    return math.isfinite(ts) and 0.0 <= ts <= MAX_TIMESTAMP


def _skipped_note(skipped: int) -> str:
    if not skipped:
        return ""
    return (
        f" ({skipped:,} scrape(s) skipped: timestamp NaN, infinite, negative or beyond year 5138)"
    )
