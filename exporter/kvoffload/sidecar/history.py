"""A long, thinned history of each group's headline figures, TTFT effect and advice, for trends.

The status page draws its trends from it on the server, and /api/v1/history serves it as JSON.
Memory stays bounded however long the sidecar runs: old samples are thinned as it fills."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from kvoffload.analysis.result import GroupAnalysis
from kvoffload.kvevents.subscriber import cancel_all
from kvoffload.sidecar.service import Service

log = logging.getLogger("kvoffload")

# The figures the page draws trends of (keys of a group's `figures`).
TREND_FIGURES = (
    "offload_hit_ratio",
    "gpu_prefix_hit_ratio",
    "load_gbps",
    "store_gbps",
    "mean_ttft_seconds",
    "gpu_kv_usage_ratio",
)
# The tier's TTFT effect per request (now, or predicted where the tier is off) and its range.
EFFECT_SERIES = ("ttft_effect_seconds", "ttft_effect_low_seconds", "ttft_effect_high_seconds")
SERIES = TREND_FIGURES + EFFECT_SERIES

Row = tuple[float | None, ...]
# Each group's samples as JSON (History.group), by (instance, model_name).
Trends = dict[tuple[str, str], dict[str, object]]


def _round(value: float | None) -> float | None:
    # Four significant digits: plenty for a trend, and a smaller JSON.
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")


def advice_state(group: GroupAnalysis) -> str:
    """What the group's badge says: its action, or "down" / "waiting" when it has no advice.

    The advice trend uses the same words, so a gap or a wait never reads as a kept tier."""
    if group.stale:
        return "down"
    if group.recommendation.insufficient_data or group.recommendation.decided_by == "warmup":
        return "waiting"  # the warm-up's placeholder is no advice (analysis.stability)
    return group.recommendation.action


def _row(group: GroupAnalysis) -> Row:
    if group.stale:
        return (None,) * len(SERIES)
    figures = tuple(_round(group.figures.get(name)) for name in TREND_FIGURES)
    ttft = group.ttft
    effect = None if ttft is None else ttft.now if ttft.now is not None else ttft.predicted
    if effect is None:
        return (*figures, None, None, None)
    return (*figures, _round(effect.seconds), _round(effect.low), _round(effect.high))


@dataclass
class _Series:
    t: list[float] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    stride: int = 1  # keep one sample of every `stride` offered
    skipped: int = 0  # offered since the last kept one

    def offer(self, now: float, row: Row, advice: str, points: int) -> None:
        """One sample, kept if it is the stride's turn; thinned past `points`."""
        if self.t and self.skipped + 1 < self.stride:
            self.skipped += 1
            return
        self.skipped = 0
        self.t.append(round(now, 1))
        self.rows.append(row)
        self.advice.append(advice)
        if len(self.t) > points:
            # Thin: every other sample, the newest kept; from now on half as often.
            start = (len(self.t) - 1) % 2
            self.t, self.rows = self.t[start::2], self.rows[start::2]
            self.advice = self.advice[start::2]
            self.stride *= 2


class History:
    """Each group's trend samples, at most `points` of them, over the sidecar's whole run."""

    # The HTTP face samples every interval (scrape or fleet read); a group whose target is down
    # records gaps. Only the first `max_groups` are kept: a fleet's come in need order.

    def __init__(self, points: int = 240, max_groups: int = 64) -> None:
        self.points = points
        self.max_groups = max_groups
        self._series: dict[tuple[str, str], _Series] = {}

    def sample(self, groups: list[GroupAnalysis], now: float) -> None:
        """Offer each group's figures, TTFT effect and advice now; forget groups gone."""
        seen = set()
        for group in groups[: self.max_groups]:
            seen.add(group.key)
            series = self._series.setdefault(group.key, _Series())
            series.offer(now, _row(group), advice_state(group), self.points)
        for key in list(self._series):
            if key not in seen:  # gone from the analysis (the window forgot it)
                del self._series[key]

    def group(self, instance: str, model: str) -> dict[str, object] | None:
        """One group's samples as JSON (as in to_json's `groups`), None when it has none."""
        series = self._series.get((instance, model))
        if series is None:
            return None
        return {
            "labels": {"model_name": model, "instance": instance},
            "t": list(series.t),
            "figures": {name: [row[i] for row in series.rows] for i, name in enumerate(SERIES)},
            "advice": list(series.advice),
            "stride": series.stride,  # samples offered per sample kept
        }

    def snapshot(self) -> Trends:
        """Every group's samples, copied: the page renders them in a thread while the
        sampling goes on."""
        out: Trends = {}
        for instance, model in list(self._series):
            if (group := self.group(instance, model)) is not None:
                out[instance, model] = group
        return out

    def to_json(self) -> dict[str, object]:
        """GET /api/v1/history: every group's samples and what the series are."""
        groups = list(self.snapshot().values())
        return {"figures": list(SERIES), "points": self.points, "groups": groups}


HISTORY_KEY = web.AppKey[History]("history")


def add_history(app: web.Application, service: Service, history: History | None = None) -> History:
    """GET /api/v1/history, and a task sampling the service's groups every interval (its
    status' `interval_seconds`) while the app runs."""
    kept = history if history is not None else History()
    app[HISTORY_KEY] = kept

    async def handler(_request: web.Request) -> web.Response:
        return web.json_response(kept.to_json())

    async def sampling(_app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            every = service.status().get("interval_seconds")
            every = max(0.05, float(every)) if isinstance(every, int | float) else 5.0
            while True:
                try:
                    kept.sample(service.groups(), time.time())
                except Exception:  # the trends must never take the sidecar down
                    log.exception("sampling the status page's history")
                await asyncio.sleep(every)

        task = asyncio.create_task(loop())
        yield
        await cancel_all([task])

    app.router.add_get("/api/v1/history", handler)
    app.cleanup_ctx.append(sampling)
    return kept
