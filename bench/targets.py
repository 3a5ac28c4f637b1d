"""A process that plays vLLM targets, run apart from the sidecar so the sidecar's CPU time is
measured alone.

Two ways: `--port P` alone serves GET /t/<i>/metrics on 127.0.0.1:P (one host, many paths);
`--addresses N` serves GET /metrics on N loopback addresses 127.0.0.2, 127.0.0.3, … at port P
(Linux routes all of 127/8 to lo), each its own target with its own connections, as N vLLM
servers would be. Each target returns the bodies of `--bodies` in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import pickle

from aiohttp import web


def addresses(n: int) -> list[str]:
    """127.0.0.2, 127.0.0.3, …: n loopback addresses, one per target."""
    first = int(ipaddress.IPv4Address("127.0.0.2"))
    return [str(ipaddress.IPv4Address(first + i)) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bodies", required=True, help="pickle of a list of bytes")
    ap.add_argument("--addresses", type=int, default=0, help="serve /metrics on N addresses")
    args = ap.parse_args()
    with open(args.bodies, "rb") as fh:
        bodies: list[bytes] = pickle.load(fh)
    served: dict[str, int] = {}

    def body_for(key: str) -> web.Response:
        n = served.get(key, 0)
        served[key] = n + 1
        return web.Response(
            body=bodies[n % len(bodies)], content_type="text/plain", charset="utf-8"
        )

    async def by_path(request: web.Request) -> web.Response:
        return body_for(request.match_info["i"])

    async def by_address(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        return body_for(sock[0] if sock else "?")

    app = web.Application()
    if not args.addresses:
        app.router.add_get("/t/{i}/metrics", by_path)
        web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
        return
    app.router.add_get("/metrics", by_address)

    async def serve() -> None:
        # vLLM's server (uvicorn) closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE):
        # at a 15 s interval every scrape opens a new one, and so it does here.
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=5.0)
        await runner.setup()
        for host in addresses(args.addresses):
            await web.TCPSite(runner, host, args.port, backlog=256).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
