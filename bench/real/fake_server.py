#!/usr/bin/env python3
"""Local dry run only (FAKE=1 orch.py): a stand-in for `vllm serve` on PORT.

/health, a streaming /v1/completions (a few ms per token, with usage and cached_tokens), and
/metrics proxied from `kvoffload sim` (started here on PORT+1000, publishing its KV events on
ZPORT with replay on RPORT). Needs aiohttp and the project's `kvoffload` (KVOFFLOAD_BIN, default
the checkout's .venv/bin/kvoffload).  usage: fake_server.py PORT ZPORT RPORT
"""

import asyncio
import json
import os
import subprocess
import sys
import time

from aiohttp import ClientSession, web

PORT, ZPORT, RPORT = (int(a) for a in sys.argv[1:4])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KVO = os.environ.get("KVOFFLOAD_BIN", os.path.join(ROOT, ".venv", "bin", "kvoffload"))
SIM = subprocess.Popen(
    [
        KVO,
        "sim",
        "--scenario",
        "rag-hot-set-fits",
        "--speed",
        "10",
        "--listen",
        f"127.0.0.1:{PORT + 1000}",
        "--kv-events",
        f"tcp://127.0.0.1:{ZPORT}",
        "--kv-events-replay",
        f"tcp://127.0.0.1:{RPORT}",
    ]
)
T0 = time.time()


async def health(_req):
    return web.Response(status=200 if time.time() - T0 > 3 else 503)


async def metrics(_req):
    async with ClientSession() as s, s.get(f"http://127.0.0.1:{PORT + 1000}/metrics") as r:
        return web.Response(body=await r.read(), content_type="text/plain")


async def completions(req):
    body = await req.json()
    n = int(body.get("max_tokens", 1))
    plen = len(body["prompt"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    await asyncio.sleep(0.02 + plen / 200_000)
    for _ in range(n):
        ev = {"choices": [{"text": "x", "index": 0}], "usage": None}
        await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
        await asyncio.sleep(0.002)
    usage = {
        "prompt_tokens": plen,
        "completion_tokens": n,
        "total_tokens": plen + n,
        "prompt_tokens_details": {"cached_tokens": plen // 2},
    }
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


app = web.Application()
app.router.add_get("/health", health)
app.router.add_get("/metrics", metrics)
app.router.add_post("/v1/completions", completions)
try:
    web.run_app(app, host="127.0.0.1", port=PORT, print=None, access_log=None)
finally:
    SIM.terminate()
