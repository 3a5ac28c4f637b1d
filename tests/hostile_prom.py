"""A small Prometheus HTTP API on loopback that serves a simulator recording, for the tests of a
hostile or broken Prometheus (`test_hostile_prometheus`): it answers the three kinds of
question `fleet.source.FleetReader` asks (/api/v1/series, the count_over_time probe, range
selectors of instances), and each test makes it misbehave through `FakePrometheus.hook` (an
answer's JSON rewritten) or its own aiohttp handlers."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from kvoffload.recording.openmetrics import finalize_journal
from kvoffload.sim import scenarios
from kvoffload.sim.write_recording import record_scenario

from helpers import free_port

Labels = dict[str, str]
SeriesData = list[tuple[Labels, list[tuple[float, float]]]]
Hook = Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any] | None]

_LINE = re.compile(r"^(?P<name>[^{ ]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+) (?P<ts>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_WINDOW = re.compile(r"\[(\d+)ms\]$")
_INSTANCES = re.compile(r'instance=~"((?:[^"\\]|\\.)*)"')


def simulated_fleet(work: Path, instances: list[str], seconds: float = 600.0) -> SeriesData:
    """`seconds` of the simulator's rag scenario at 15 s, as the series of each instance."""
    scenario = scenarios.get("rag-hot-set-fits")
    journal, out = work / "rag.journal", work / "rag.om"
    record_scenario(scenario, str(journal), seconds, 15.0, instance="x:8000")
    finalize_journal(str(journal), str(out))
    by_key: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for line in out.read_text().splitlines():
        m = _LINE.match(line)
        if not m or line.startswith("#") or m["name"].endswith("_created"):
            continue
        labels = {"__name__": m["name"], **dict(_LABEL.findall(m["labels"] or ""))}
        key = tuple(sorted(labels.items()))
        by_key.setdefault(key, []).append((float(m["ts"]), float(m["value"])))
    data: SeriesData = []
    for instance in instances:
        for key, points in by_key.items():
            data.append(({**dict(key), "instance": instance}, points))
    return data


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _value(v: float) -> str:
    if v != v:
        return "NaN"
    return "+Inf" if v == float("inf") else "-Inf" if v == -float("inf") else repr(v)


class FakePrometheus:
    """The API over `data`; `hook(path, form, answer)` may return another answer (or None to
    keep it). `questions` counts what was asked, `headers` keeps each question's headers."""

    def __init__(self, data: SeriesData) -> None:
        self.data = data
        self.hook: Hook | None = None
        self.questions = 0
        self.headers: list[dict[str, str]] = []

    def answer(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        if path == "/api/v1/series":
            result: Any = [labels for labels, _points in self.data]
            return {"status": "success", "data": result}
        query = form.get("query", "")
        end = float(form.get("time", "0"))
        if query.startswith("max by (instance) (count_over_time("):
            counts: dict[str, int] = {}
            for labels, points in self.data:
                if labels["__name__"] == "vllm:prompt_tokens_total":
                    counts[labels["instance"]] = len(points)
            result = [
                {"metric": {"instance": i}, "value": [end, str(n)]} for i, n in counts.items()
            ]
            return {"status": "success", "data": {"resultType": "vector", "result": result}}
        window = _WINDOW.search(query)
        wanted = _INSTANCES.search(query)
        if window is None or wanted is None:
            return {"status": "error", "errorType": "bad_data", "error": "not understood"}
        start = end - int(window[1]) / 1000
        pattern = re.compile(wanted[1].replace("\\\\", "\\"))
        result = []
        for labels, points in self.data:
            if pattern.fullmatch(labels["instance"]):
                values = [[t, _value(v)] for t, v in points if start < t <= end]
                if values:
                    result.append({"metric": labels, "values": values})
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.questions += 1
        self.headers.append(dict(request.headers))
        form = {k: str(v) for k, v in (await request.post()).items()}
        path = request.path
        answer = self.answer(path, form)
        if self.hook is not None:
            answer = self.hook(path, form, answer) or answer
        # Compact, as Prometheus writes it (`[1.5,"+Inf"]`).
        return web.json_response(answer, dumps=_compact)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/v1/{tail:.*}", self.handle)
        return app


def serve_in_thread(app: web.Application, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on loopback from a thread of its own; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def one_route_app(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.Application:
    """An app answering every API question with `handler`."""
    app = web.Application()
    app.router.add_route("*", "/api/v1/{tail:.*}", handler)
    return app
