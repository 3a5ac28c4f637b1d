"""Serve a SimServer over HTTP like a vLLM API server: GET /metrics and GET /ground-truth.

Virtual time = speed × wall seconds since the app started. The clock is advanced lazily on
every request and by a background task (so time-driven state, like stores landing, moves even
when nobody scrapes). When the clock runs faster than real time, /metrics stamps every sample
with the virtual wall time (start_epoch + now), so that a scraper (Prometheus honours target
timestamps, so does the sidecar) sees rates per virtual second; at speed 1 the body is exactly
vLLM's, without timestamps. `timestamps=True/False` forces either.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .simulator import SimServer

SIM_KEY = web.AppKey("sim", SimServer)
_TICK_S = 0.25  # background advance period (wall seconds)


def make_app(
    sim: SimServer, speed: float = 60.0, timestamps: bool | None = None
) -> web.Application:
    if speed <= 0:
        raise ValueError("speed must be positive")
    stamped = speed != 1.0 if timestamps is None else timestamps
    app = web.Application()
    app[SIM_KEY] = sim
    state = {"t0": time.monotonic(), "base": sim.now}

    def advance() -> None:
        target = state["base"] + speed * (time.monotonic() - state["t0"])
        if target > sim.now:
            sim.advance_to(target)

    async def metrics(_: web.Request) -> web.Response:
        advance()
        return web.Response(
            body=sim.render(timestamped=stamped), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}
        )

    async def ground_truth(request: web.Request) -> web.Response:
        advance()
        full = request.query.get("requests", "1") not in ("0", "false", "no")
        return web.json_response(sim.ground_truth(include_requests=full))

    async def ticker() -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            advance()

    async def start_ticker(app: web.Application) -> AsyncIterator[None]:
        state["t0"] = time.monotonic()
        state["base"] = sim.now
        task = asyncio.create_task(ticker())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/ground-truth", ground_truth)
    app.cleanup_ctx.append(start_ticker)
    return app
