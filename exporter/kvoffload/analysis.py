"""From a window of scrapes to the JSON contract shared by `analyze --json` and the sidecar."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.advisor import Recommendation, Thresholds, advise
from kvoffload.errors import InputError
from kvoffload.parse import Exposition
from kvoffload.signals import FIGURE_KEYS, Context, compute_figures
from kvoffload.vllm import extract
from kvoffload.window import Window


@dataclass(frozen=True)
class Settings:
    world_size: int = 1
    memory_limit_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)


def analyze_window(
    window: Window, settings: Settings | None = None, lifetime: bool = False
) -> list[dict[str, object]]:
    """One JSON object per (instance, model_name) group that has at least two points.

    lifetime: the figures are totals since the engine started (one snapshot, no clock), so
    per-second rates are undefined and only the amount of traffic says whether it is enough.
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
        )
        groups.append({
            "labels": labels,
            "offloading": offloading,
            "window_seconds": delta.seconds,
            "figures": figures,
            "recommendation": rec.to_json(),
            "naming": static.naming,
            "engines": sorted(static.engines),
        })
    return groups


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
