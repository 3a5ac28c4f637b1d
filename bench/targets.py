"""A process that plays N vLLM targets: GET /t/<i>/metrics returns successive simulator bodies.

Run apart from the sidecar so the sidecar's CPU time is measured alone.
"""

from __future__ import annotations

import argparse
import pickle

from aiohttp import web


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bodies", required=True, help="pickle of a list of bytes")
    args = ap.parse_args()
    with open(args.bodies, "rb") as fh:
        bodies: list[bytes] = pickle.load(fh)
    served: dict[str, int] = {}

    async def metrics(request: web.Request) -> web.Response:
        key = request.match_info["i"]
        n = served.get(key, 0)
        served[key] = n + 1
        return web.Response(
            body=bodies[n % len(bodies)], content_type="text/plain", charset="utf-8"
        )

    app = web.Application()
    app.router.add_get("/t/{i}/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
