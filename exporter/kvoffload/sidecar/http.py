"""The sidecar's HTTP face (aiohttp): /metrics, /api/v1/status, the status page, health.

The same for the scraping sidecar and for the fleet read from Prometheus (`serve --prometheus`)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import (
    CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE,
)

from kvoffload.sidecar.exposition import render_metrics, rendering
from kvoffload.sidecar.history import HISTORY_KEY, Trends, add_history
from kvoffload.sidecar.page import render_body, render_page
from kvoffload.sidecar.service import Service

SIDECAR_KEY = web.AppKey[Service]("sidecar")


def make_app(
    sidecar: Service, manage_lifecycle: bool = True, metrics_path: str = "/metrics"
) -> web.Application:
    """The sidecar's routes, its metrics at `metrics_path` (--web.telemetry-path)."""
    app = web.Application()
    app[SIDECAR_KEY] = sidecar
    # The page links the metrics relative to itself (a proxy may mount it under a prefix).
    metrics_href = metrics_path[1:]

    async def metrics(request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        openmetrics = "application/openmetrics-text" in accept
        # Written in a thread from a snapshot: a thousand targets' figures would hold up the
        # event loop (and every scrape) for as long as they take to write.
        body = await asyncio.to_thread(render_metrics, sidecar.snapshot(), openmetrics)
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE_LATEST
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def status(_request: web.Request) -> web.Response:
        view = sidecar.snapshot()  # the JSON of a thousand groups is written off the loop too
        text = await asyncio.to_thread(_status_json, view)
        return web.Response(text=text, content_type="application/json")

    async def index(request: web.Request) -> web.Response:
        # Rendered whole on the server (sidecar.page); ?part=body is what its script swaps in.
        body_only = request.query.get("part") == "body"
        view, trends = sidecar.snapshot(), request.app[HISTORY_KEY].snapshot()
        text = await asyncio.to_thread(_page_html, view, trends, metrics_href, body_only)
        resp = web.Response(text=text, content_type="text/html", charset="utf-8")
        resp.headers["Cache-Control"] = "no-store"
        resp.enable_compression()  # a fleet's page is megabytes of repetitive markup
        return resp

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        if sidecar.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="no successful scrape yet\n")

    app.router.add_get("/", index)
    app.router.add_get(metrics_path, metrics)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)

    if manage_lifecycle:

        async def lifecycle(_app: web.Application):
            await sidecar.start()
            yield
            await sidecar.stop()

        app.cleanup_ctx.append(lifecycle)
    add_history(app, sidecar)  # GET /api/v1/history: the page's trends
    return app


def _status_json(view: Service) -> str:
    with rendering():  # as for /metrics (sidecar.exposition): many dicts, no cycles
        return _dumps(view.status())


def _page_html(view: Service, history: Trends, metrics_href: str, body_only: bool) -> str:
    with rendering():
        status = view.status()
        if body_only:
            return render_body(status, history, metrics_href)
        return render_page(status, history, metrics_href)


def _dumps(obj: object) -> str:
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))
