"""A loopback HTTP server whose routes misbehave the ways a /metrics endpoint can."""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from helpers import SAMPLE


def make_bad_app() -> web.Application:
    good = SAMPLE.read_bytes()
    app = web.Application()

    async def ok(_r: web.Request) -> web.Response:
        return web.Response(body=good, content_type="text/plain")

    async def error500(_r: web.Request) -> web.Response:
        return web.Response(status=500, text="Internal Server Error")

    async def slow(_r: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(body=good)

    async def truncated(request: web.Request) -> web.StreamResponse:
        # Promise the whole body, send half of it, then drop the connection.
        resp = web.StreamResponse(headers={"Content-Length": str(len(good))})
        await resp.prepare(request)
        await resp.write(good[: len(good) // 2])
        request.transport.close()  # type: ignore[union-attr]
        return resp

    async def garbage(_r: web.Request) -> web.Response:
        return web.Response(body=os.urandom(4096), content_type="application/octet-stream")

    async def huge(request: web.Request) -> web.StreamResponse:
        # No Content-Length: the limit has to be enforced while reading.
        resp = web.StreamResponse()
        await resp.prepare(request)
        line = b'vllm:prompt_tokens_total{engine="0",model_name="m"} 1\n' * 1000
        for _ in range(2000):  # ~110 MB if nobody stops reading
            await resp.write(line)
        return resp

    async def not_vllm(_r: web.Request) -> web.Response:
        return web.Response(text="# HELP up x\n# TYPE up gauge\nup 1\n")

    for path, handler in {
        "/ok": ok,
        "/500": error500,
        "/slow": slow,
        "/truncated": truncated,
        "/garbage": garbage,
        "/huge": huge,
        "/notvllm": not_vllm,
    }.items():
        app.router.add_get(path, handler)
    return app
