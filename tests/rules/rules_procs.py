"""Real Prometheus and Alertmanager processes for the rule tests, on loopback only.

Each process gets its own data directory and a free 127.0.0.1 port, and is stopped (terminate,
then kill) by the context manager that started it, whatever happens in the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from helpers import free_port, running

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


def need(*binaries: str) -> None:
    missing = [b for b in binaries if not Path(b).exists()]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: run `make system-deps` (Debian packages "
            "prometheus and prometheus-alertmanager)"
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _wait_ready(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s: {log.read_text()[-2000:]}")


@contextlib.asynccontextmanager
async def _daemon(binary: str, workdir: Path, name: str, flags: list[str]) -> AsyncIterator[str]:
    """Run a Prometheus-family server on a free loopback port until /-/ready; yield its URL,
    stop it on exit. Its output goes to `<name>.log` in workdir, shown when it fails."""
    port = free_port()
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, *flags, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        await _wait_ready(f"{url}/-/ready", proc, log)
        yield url
    finally:
        _stop(proc)


@contextlib.asynccontextmanager
async def prometheus(
    workdir: Path, config: dict[str, Any], rule_files: dict[str, str]
) -> AsyncIterator[str]:
    """Start Prometheus with `config` (rule_files filled in); yield its base URL."""
    need(PROMETHEUS)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in rule_files.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    config = {**config, "rule_files": [str(workdir / n) for n in rule_files]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    async with _daemon(
        PROMETHEUS,
        workdir,
        "prometheus",
        [f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}"],
    ) as url:
        yield url


@contextlib.asynccontextmanager
async def alertmanager(workdir: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    need(ALERTMANAGER)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    async with _daemon(
        ALERTMANAGER,
        workdir,
        "alertmanager",
        [
            f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'data'}",
            "--cluster.listen-address=",
        ],
    ) as url:
        yield url


# An aiohttp app on a free loopback port, cleaned up on exit (shared with the other tests).
serve = running


def body_app(body: Callable[[], str]) -> web.Application:
    """A fake vLLM /metrics serving whatever `body()` returns now, in the text format."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=body().encode(), headers={"Content-Type": TEXT_FORMAT})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


class PromAPI:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def _get(self, path: str, params: dict[str, str] | list[tuple[str, str]]) -> Any:
        async with self.session.get(f"{self.url}{path}", params=params) as r:
            data = await r.json()
        if data.get("status") != "success":
            raise AssertionError(f"{path} {params}: {data}")
        return data["data"]

    async def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = await self._get("/api/v1/query", params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    async def series(self, match: str) -> list[dict[str, str]]:
        return await self._get("/api/v1/series", [("match[]", match)])

    async def rules(self) -> list[dict[str, Any]]:
        data = await self._get("/api/v1/rules", {})
        return [r for g in data["groups"] for r in g["rules"]]

    async def wait_for(self, expr: str, n: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(await self.query(expr)) >= n:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{expr}: fewer than {n} series after {timeout:.0f} s")
