"""A short history of each group's headline figures, for the status page's trends.

The page draws its sparklines from /api/v1/history once when it opens (so a page opened now
shows the last minutes at once) and then from each /api/v1/status it polls. The HTTP face
samples the service's groups every interval (the scrape interval, or the fleet's read
interval); a group whose target is down records gaps (its figures are frozen, not new).
Bounded: `points` samples per group, the first `max_groups` groups (a fleet's are in order
of need), values to four significant digits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator

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

Row = tuple[float | None, ...]


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")


class History:
    def __init__(self, points: int = 120, max_groups: int = 64) -> None:
        self.points = points
        self.max_groups = max_groups
        self._series: dict[tuple[str, str], deque[tuple[float, Row]]] = {}

    def sample(self, groups: list[GroupAnalysis], now: float) -> None:
        seen = set()
        for group in groups[: self.max_groups]:
            seen.add(group.key)
            row: Row = tuple(
                None if group.stale else _round(group.figures.get(name)) for name in TREND_FIGURES
            )
            series = self._series.get(group.key)
            if series is None:
                series = self._series[group.key] = deque(maxlen=self.points)
            series.append((round(now, 1), row))
        for key in list(self._series):
            if key not in seen:  # gone from the analysis (the window forgot it)
                del self._series[key]

    def to_json(self) -> dict[str, object]:
        groups = []
        for (instance, model), series in self._series.items():
            groups.append(
                {
                    "labels": {"model_name": model, "instance": instance},
                    "t": [t for t, _ in series],
                    "figures": {
                        name: [row[i] for _, row in series] for i, name in enumerate(TREND_FIGURES)
                    },
                }
            )
        return {"figures": list(TREND_FIGURES), "points": self.points, "groups": groups}


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
