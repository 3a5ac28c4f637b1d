"""Peak RSS of the Prometheus client against the answers of issue #25 item 5, at the default
limits (`PromLimits`): a 1.5 GB error body, a 2 MB gzip body inflating to 2 GB, 10 M points.
Each case runs in a fresh process against a loopback server that generates its answer as it
sends it (nothing held). Run: `.venv/bin/python bench/prom_hostile_memory.py`."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

from aiohttp import web

sys.path.insert(0, "tests")
from hostile_prom import serve_in_thread

MIB = 1024 * 1024


async def error_body(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=500)
    await resp.prepare(request)
    block = b"x" * MIB
    try:
        for _ in range(1536):  # 1.5 GiB
            await resp.write(block)
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def gzip_bomb(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Encoding": "gzip"})
    await resp.prepare(request)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * MIB
    try:
        await resp.write(packer.compress(b'{"status":"success","data":['))
        for _ in range(2048):  # 2 GiB inflated, some 2 MB sent
            await resp.write(packer.compress(block))
        await resp.write(packer.compress(b"]}") + packer.flush())
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def many_points(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    try:
        await resp.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
        for s in range(100):  # 100 series of 100,000 points: 10 M
            head = b"," if s else b""
            await resp.write(head + b'{"metric":{"instance":"a"},"values":[')
            points = ",".join(f'[{1.7e9 + i:.3f},"{i}"]' for i in range(100_000))
            await resp.write(points.encode() + b"]}")
        await resp.write(b"]}}")
    except (ConnectionError, RuntimeError):
        pass
    return resp


CLIENT = """
import resource, sys, time
from kvoffload.fleet.promapi import PrometheusAPI, PromAPIError
api = PrometheusAPI(sys.argv[1], gzip=True)
t = time.monotonic()
try:
    api.query_instant("up[1h]", 1.7e9)
    outcome = "read"
except PromAPIError as exc:
    outcome = str(exc)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, time.monotonic() - t, outcome)
"""


def case(name: str, handler: object) -> dict[str, object]:
    app = web.Application()
    app.router.add_route("*", "/api/v1/{tail:.*}", handler)  # type: ignore[arg-type]
    for url in serve_in_thread(app):
        out = subprocess.run(
            [sys.executable, "-c", CLIENT, url], capture_output=True, text=True, timeout=600
        )
        rss, seconds, outcome = out.stdout.split(" ", 2)
        return {
            "case": name,
            "peak_rss_mib": int(rss),
            "seconds": round(float(seconds), 2),
            "outcome": outcome.strip()[:160],
        }
    raise AssertionError


def main() -> None:
    for name, handler in [
        ("1.5 GiB error body", error_body),
        ("gzip inflating to 2 GiB", gzip_bomb),
        ("10 M points", many_points),
    ]:
        print(json.dumps(case(name, handler)))


if __name__ == "__main__":
    main()
