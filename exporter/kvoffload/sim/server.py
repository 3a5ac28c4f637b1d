"""Serve a SimServer over HTTP like a vLLM API server: GET /metrics and GET /ground-truth.

The sidecar, Prometheus and tests scrape it like a real vLLM, at any speed.
Its clocks, timestamps and KV events: docs/scenarios.md ("Serving")."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .simulator import SimServer

if TYPE_CHECKING:
    from .kv_events import ZmqEventPublisher

SIM_KEY = web.AppKey("sim", SimServer)
_TICK_S = 0.25  # background advance period (wall seconds)
# Most wall time one advance may take: a simulator slower than its speed falls behind rather
# than holding the event loop (a scrape must answer within Prometheus's timeout).
_ADVANCE_BUDGET_S = 0.2


def make_app(
    sim: SimServer,
    speed: float = 60.0,
    timestamps: bool | None = None,
    kv_events_endpoint: str | None = None,
    kv_events_replay: str | None = None,
    kv_events_topic: str = "",
    clock: Callable[[], float] = time.monotonic,
    metrics_path: str = "/metrics",
) -> web.Application:
    """The HTTP app, publishing KV events too with `kv_events_endpoint` (kv_events.should_bind).

    Sockets open at start-up and close at cleanup, so the app owns them whole. `clock` is the wall
    clock simulated time follows: a test steps its own, so progress never depends on scheduling."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    if kv_events_replay is not None and kv_events_endpoint is None:
        raise ValueError("kv_events_replay needs kv_events_endpoint")
    mapped = sim.mapped_clock
    if mapped and abs(sim.time_scale * speed - 1.0) > 1e-9:
        raise ValueError(
            f"the simulator's wall clock runs at {1 / sim.time_scale:g}x, not the app's {speed:g}x"
        )
    if kv_events_endpoint is not None:
        sim.enable_kv_events()
    # A wall-clock simulator serves no timestamps, like vLLM, so Prometheus ingests any speed;
    # a virtual one stamps samples above speed 1 so an in-process sidecar sees simulated seconds.
    stamped = (speed != 1.0 and not mapped) if timestamps is None else timestamps
    events = None
    if kv_events_endpoint is not None:
        events = (kv_events_endpoint, kv_events_replay, kv_events_topic)
    served = _ServedSim(sim, speed, clock, stamped, events)
    app = web.Application()
    app[SIM_KEY] = sim
    app.router.add_get(metrics_path, served.metrics)
    app.router.add_get("/ground-truth", served.ground_truth)
    app.cleanup_ctx.append(served.serving)
    return app


class _ServedSim:
    """The simulator behind the app: simulated time follows `clock` at `speed`.

    With `events` (endpoint, replay endpoint, topic), its KV events go out on one publisher per
    rank."""

    def __init__(
        self,
        sim: SimServer,
        speed: float,
        clock: Callable[[], float],
        stamped: bool,
        events: tuple[str, str | None, str] | None,
    ) -> None:
        self.sim = sim
        self.speed = speed
        self.clock = clock
        self.stamped = stamped
        self.events = events
        self.t0 = clock()
        self.base = sim.now
        self.publishers: list[ZmqEventPublisher] = []

    def advance(self) -> None:
        sim = self.sim
        target = self.base + self.speed * (self.clock() - self.t0)
        if target <= sim.now:
            return
        # In slices of 50 ms of simulated-at-speed time, within a budget: state in between
        # is consistent (advance_to leaves it at an instant), and a late one catches up on
        # the next tick.
        step = max(self.speed * 0.05, 1e-3)
        deadline = time.perf_counter() + _ADVANCE_BUDGET_S
        while sim.now < target and time.perf_counter() < deadline:
            sim.advance_to(min(target, sim.now + step))

    async def metrics(self, _: web.Request) -> web.Response:
        self.advance()
        return web.Response(
            body=self.sim.render(timestamped=self.stamped),
            headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4},
        )

    async def ground_truth(self, request: web.Request) -> web.Response:
        self.advance()
        full = request.query.get("requests", "1") not in ("0", "false", "no")
        return web.json_response(self.sim.ground_truth(include_requests=full))

    def publish_kv_events(self) -> None:
        if not self.publishers:
            return
        from .kv_events import encode_batch, is_restart_batch

        for rank, ts, events in self.sim.drain_kv_events():
            pub = self.publishers[rank]
            if is_restart_batch(events):
                pub.reset()  # a restarted process's sequence starts at 0 again
            pub.publish(encode_batch(ts, events, rank))
        for pub in self.publishers:
            pub.service_replay()

    async def ticker(self) -> None:
        # Requests advance the clock too; this keeps time-driven state (stores landing) moving
        # between scrapes.
        while True:
            await asyncio.sleep(_TICK_S)
            self.advance()
            self.publish_kv_events()

    def open_publishers(self) -> None:
        """One publisher per DP rank; all closed again if one fails to open."""
        if self.events is None:
            return
        from .kv_events import ZmqEventPublisher

        endpoint, replay, topic = self.events
        try:
            for rank in range(self.sim.scenario.dp):
                self.publishers.append(
                    ZmqEventPublisher(endpoint, replay, topic=topic, dp_rank=rank)
                )
        except BaseException:
            for pub in self.publishers:
                pub.close()
            raise

    async def serving(self, _app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: the publishers open and the ticker runs while it serves."""
        self.open_publishers()
        sim = self.sim
        self.t0 = self.clock()
        self.base = sim.now
        if sim.mapped_clock:
            # Anchor the wall clock to the moment serving starts (construction was earlier).
            sim.epoch = time.time() - sim.now * sim.time_scale
        task = asyncio.create_task(self.ticker())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for pub in self.publishers:
                pub.close()
            self.publishers.clear()
