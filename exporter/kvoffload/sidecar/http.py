"""The sidecar's HTTP face (aiohttp): /metrics, /api/v1/status, the status page, health; the
same for the scraping sidecar and for the fleet read from Prometheus (`serve --prometheus`)."""

from __future__ import annotations

import importlib.resources
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import (
    CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from kvoffload.sidecar.history import add_history
from kvoffload.sidecar.metrics import build_registry
from kvoffload.sidecar.service import Service

SIDECAR_KEY = web.AppKey[Service]("sidecar")


def _page() -> bytes:
    return importlib.resources.files("kvoffload.sidecar").joinpath("web/index.html").read_bytes()


def make_app(
    sidecar: Service, manage_lifecycle: bool = True, metrics_path: str = "/metrics"
) -> web.Application:
    """The sidecar's routes, its metrics at `metrics_path` (--web.telemetry-path)."""
    app = web.Application()
    app[SIDECAR_KEY] = sidecar
    registry = build_registry(sidecar)
    # The page links the metrics relative to itself (a proxy may mount it under a prefix).
    page = _page().replace(b'href="metrics"', f'href="{metrics_path[1:]}"'.encode())

    async def metrics(request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        if "application/openmetrics-text" in accept:
            body = generate_openmetrics(registry)
            content_type = OPENMETRICS_CONTENT_TYPE
        else:
            body = generate_latest(registry)
            content_type = CONTENT_TYPE_LATEST
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def status(_request: web.Request) -> web.Response:
        return web.json_response(sidecar.status(), dumps=_dumps)

    async def index(_request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8")

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


def _dumps(obj: object) -> str:
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))
