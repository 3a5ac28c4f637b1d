"""A hostile or broken Prometheus is bounded (issue #25 items 4 and 5): each attack is served by
a loopback server started here (`hostile_prom`), and `analyze --prometheus` must end with one
line and a non-zero exit (or read the other engines), `serve --prometheus` must keep answering
and stop on SIGTERM. Sizes are kept small by giving the client small limits."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web
from hostile_prom import FakePrometheus, one_route_app, serve_in_thread, simulated_fleet

from kvoffload.analysis.analyze import Settings
from kvoffload.errors import InputError
from kvoffload.fleet.promapi import PromAPIError, PrometheusAPI, PromLimits
from kvoffload.fleet.service import FleetConfig, FleetService
from kvoffload.fleet.source import FleetReader, ReadStats

from helpers import free_port

KVO = [sys.executable, "-m", "kvoffload"]
INSTANCES = ["a:8000", "b:8000", "c:8000"]


async def _write_without_end(resp: web.StreamResponse, sent: Any) -> None:
    """Write 64 KiB blocks until the client hangs up (6.5 GB were it all read), counting them."""
    block = b"x" * 65536
    try:
        for _ in range(100_000):
            await resp.write(block)
            sent.bytes += len(block)
    except (ConnectionError, RuntimeError):
        pass


def kvo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one line on stderr (after any progress lines): that line."""
    assert r.returncode != 0, r.stdout[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines, r.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return simulated_fleet(tmp_path_factory.mktemp("fleet"), INSTANCES)


@pytest.fixture
def prom(data: Any) -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus(data)
    for url in serve_in_thread(fake.app()):
        yield fake, url


def span(data: Any) -> tuple[float, float]:
    times = [t for _labels, points in data for t, _v in points]
    return min(times), max(times)


def analyze(
    url: str, data: Any, *extra: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    start, end = span(data)
    return kvo(
        "analyze",
        "--prometheus",
        url,
        "--start",
        str(start),
        "--end",
        str(end),
        *extra,
        timeout=timeout,
    )


def test_the_fake_serves_a_fleet(prom: tuple[FakePrometheus, str], data: Any) -> None:
    """The reference: the fake Prometheus answers like one; every engine is read."""
    _fake, url = prom
    r = analyze(url, data, "--json", "--jobs", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["errors"] == []
    assert {g["labels"]["instance"] for g in report["groups"]} == set(INSTANCES)


# -- a total deadline per question ------------------------------------------------------------
def _drip_app(where: str, started: threading.Event | None = None) -> web.Application:
    """Answers one byte every 0.2 s, forever: in the headers or in the body."""

    async def drip(request: web.Request) -> web.StreamResponse:
        if started is not None:
            started.set()
        transport = request.transport
        assert transport is not None
        if where == "headers":
            transport.write(b"HTTP/1.1 200 OK\r\n")
            while not transport.is_closing():
                transport.write(b"X")
                await asyncio.sleep(0.2)
            return web.Response()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status":"success","data":')
        while not transport.is_closing():
            await resp.write(b" ")
            await asyncio.sleep(0.2)
        return resp

    return one_route_app(drip)


@pytest.mark.timing
@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_slow_drip_ends_at_the_question_deadline(where: str) -> None:
    for url in serve_in_thread(_drip_app(where)):
        api = PrometheusAPI(url, timeout=1.5)
        started = time.monotonic()
        with pytest.raises(PromAPIError) as err:
            api.series('{__name__=~"vllm:.*"}', 0, 60)
        assert time.monotonic() - started < 30  # (the bound of a hang, not a timing claim)
        assert "no complete answer within 1.5 s" in str(err.value)
        assert "/api/v1/series" in str(err.value) and "vllm:.*" in str(err.value)  # which one


def test_analyze_says_which_question_timed_out() -> None:
    for url in serve_in_thread(_drip_app("body")):
        r = kvo("analyze", "--prometheus", url, "--prometheus-timeout", "2s", timeout=60)
        line = one_line_error(r)
        assert "/api/v1/series" in line and "no complete answer within 2 s" in line, line


# -- SIGTERM while a question hangs -----------------------------------------------------------
def test_serve_stops_on_sigterm_while_a_question_hangs(tmp_path: Path) -> None:
    asked = threading.Event()
    for url in serve_in_thread(_drip_app("body", asked)):
        port = free_port()
        args = ["serve", "--prometheus", url, "--prometheus-timeout", "10m"]
        with open(tmp_path / "serve.log", "wb") as log:
            proc = subprocess.Popen(
                [*KVO, *args, "--listen", f"127.0.0.1:{port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            assert asked.wait(60), (tmp_path / "serve.log").read_text()
            # The read hangs; the sidecar answers meanwhile.
            deadline = time.monotonic() + 30
            while True:
                try:
                    health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                    break
                except requests.RequestException:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert health.status_code in (200, 503)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=10)  # not 10 minutes
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_a_stopped_fleet_service_ends_its_read_at_once(data: Any) -> None:
    """FleetService.stop aborts the question being asked, from the event loop's thread."""
    asked = threading.Event()

    async def run(url: str) -> None:
        start, end = span(data)
        config = FleetConfig(fixed=(start, end), interval_seconds=3600.0)
        service = FleetService(config, PrometheusAPI(url, timeout=600))
        await service.start()
        await asyncio.to_thread(asked.wait, 30)
        await asyncio.wait_for(service.stop(), 10)
        assert service.last is None and service.failures == 0  # a stop, not a failed read

    for url in serve_in_thread(_drip_app("body", asked)):
        asyncio.run(run(url))


# -- sample counts that are no counts; the number of questions --------------------------------
def _count_hook(counts: dict[str, str]) -> Any:
    def hook(path: str, form: dict[str, str], answer: dict[str, Any]) -> dict[str, Any] | None:
        if "count_over_time" in form.get("query", ""):
            for s in answer["data"]["result"]:
                s["value"][1] = counts.get(s["metric"]["instance"], s["value"][1])
        return None

    return hook


def test_absurd_sample_counts_leave_their_instance_out(
    prom: tuple[FakePrometheus, str], data: Any
) -> None:
    fake, url = prom
    fake.hook = _count_hook({"a:8000": "1e300", "b:8000": "NaN"})
    r = analyze(url, data, "--json", "--jobs", "1", timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    errors = {e["instance"]: e["error"] for e in report["errors"]}
    assert set(errors) == {"a:8000", "b:8000"}
    assert "count_over_time answered 1e+300 samples" in errors["a:8000"]
    assert "not a sample count" in errors["b:8000"] and "nan" in errors["b:8000"]
    assert {g["labels"]["instance"] for g in report["groups"]} == {"c:8000"}
    assert fake.questions < 20


def test_only_absurd_counts_is_one_line(prom: tuple[FakePrometheus, str], data: Any) -> None:
    fake, url = prom
    fake.hook = _count_hook(dict.fromkeys(INSTANCES, "-Inf"))
    line = one_line_error(analyze(url, data, timeout=60))
    assert line.startswith("kvoffload: error: no instance could be read:") and "-inf" in line, line


def test_a_read_of_too_many_questions_is_refused(
    prom: tuple[FakePrometheus, str], data: Any
) -> None:
    _fake, url = prom
    start, end = span(data)
    reader = FleetReader(PrometheusAPI(url), start, end, point_budget=100, max_questions=50)
    with pytest.raises(InputError, match=r"would take [\d,]+ questions \(at most 50\)"):
        reader.batches()


# -- bounded bodies and points ----------------------------------------------------------------
class _Sent:
    bytes = 0


def _endless_app(status: int, sent: type[_Sent]) -> web.Application:
    """An answer without Content-Length that never ends (64 KiB writes), counting what it got
    out before the client hung up."""

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status":"error","errorType":"internal","error":"')
        await _write_without_end(resp, sent)
        return resp

    return one_route_app(endless)


@pytest.mark.parametrize("status", [500, 200])
def test_an_endless_body_is_read_only_so_far(status: int) -> None:
    sent = type("Sent", (_Sent,), {})
    for url in serve_in_thread(_endless_app(status, sent)):
        api = PrometheusAPI(url, limits=PromLimits(max_answer_bytes=1024 * 1024))
        with pytest.raises(PromAPIError) as err:
            api.series("{}", 0, 60)
        text = str(err.value)
        assert "\n" not in text and len(text) < 1000
        if status == 200:
            assert "larger than 1 MiB (the most one answer may hold)" in text
        else:
            assert "HTTP 500" in text  # its first 64 KiB, cut: not the API's JSON
    # What the server got out before the client closed: what the socket buffers take, not GB.
    assert sent.bytes < 64 * 1024 * 1024


def _gzip_app(body: bytes) -> web.Application:
    packed = gzip.compress(body, 9)

    async def bomb(_request: web.Request) -> web.Response:
        return web.Response(
            body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    return one_route_app(bomb)


def test_a_gzip_bomb_is_stopped_once_inflated() -> None:
    # 2 MiB inflated from about 2 KiB: past a 1 MiB limit once inflated.
    body = b'{"status":"success","data":[' + b" " * (2 * 1024 * 1024) + b"]}"
    for url in serve_in_thread(_gzip_app(body)):
        api = PrometheusAPI(url, gzip=True, limits=PromLimits(max_answer_bytes=1024 * 1024))
        with pytest.raises(PromAPIError, match="larger than 1 MiB once inflated"):
            api.series("{}", 0, 60)
        # Under the limit, the same encoding reads.
        small = PrometheusAPI(url, gzip=True, limits=PromLimits(max_answer_bytes=4 * 1024 * 1024))
        assert small.series("{}", 0, 60) == []


def test_a_compressed_body_over_the_limit_on_the_wire() -> None:
    body = b'{"status":"success","data":["' + os.urandom(900 * 1024).hex().encode() + b'"]}'
    for url in serve_in_thread(_gzip_app(body)):
        api = PrometheusAPI(url, gzip=True, limits=PromLimits(max_answer_bytes=1024 * 1024))
        with pytest.raises(PromAPIError, match="larger than 1 MiB"):
            api.series("{}", 0, 60)


def test_points_per_answer_are_capped(prom: tuple[FakePrometheus, str], data: Any) -> None:
    _fake, url = prom
    _start, end = span(data)
    api = PrometheusAPI(url, limits=PromLimits(max_points=1000))
    with pytest.raises(PromAPIError, match="holds more than 1,000 points"):
        api.query_instant('{__name__=~"vllm:.*",instance=~"a:8000"}[1000000ms]', end)
    # Through the command: each instance alone is still over the limit: one line.
    line = one_line_error(analyze(url, data, "--prometheus-max-points", "1000", timeout=60))
    assert "no instance could be read" in line and "more than 1,000 points" in line, line


# -- warnings, escapes ------------------------------------------------------------------------
def test_many_warnings_are_counted_once_each(prom: tuple[FakePrometheus, str], data: Any) -> None:
    fake, url = prom

    def hook(path: str, form: dict[str, str], answer: dict[str, Any]) -> dict[str, Any] | None:
        # 100,000 warnings in each answer, 50,000 of them distinct, and one that repeats.
        answer["warnings"] = [f"store {i % 50_000} slow" for i in range(100_000)]
        answer["warnings"].append("partial response")
        return None

    fake.hook = hook
    r = analyze(url, data, "--jobs", "1", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    warned = [line for line in r.stdout.splitlines() if line.startswith("! ")]
    assert len(warned) <= 101  # each distinct warning once, the many past 100 counted
    assert any(line.startswith("! store 0 slow (") and "times)" in line for line in warned)
    assert not any(line.startswith("! store 1000 slow") for line in warned)  # past the 100th
    assert warned[-1].startswith("! and ") and "more warning(s) not shown" in warned[-1]


def test_read_stats_count_warnings_linearly() -> None:
    stats = ReadStats()
    stats.warn([f"w{i % 10}" for i in range(1000)])
    other = ReadStats()
    other.warn(["w0", "new"])
    stats.merge(other)
    assert stats.warnings["w0"] == 101 and stats.warnings["new"] == 1
    assert stats.warning_lines()[0] == "w0 (101 times)"


HOSTILE_TEXT = "boom\x1b[2J\x1b]0;pwned\x07\r\nforged line\u202e"


def test_server_text_is_escaped(prom: tuple[FakePrometheus, str], data: Any) -> None:
    fake, url = prom

    def hook(path: str, form: dict[str, str], answer: dict[str, Any]) -> dict[str, Any] | None:
        return {"status": "error", "errorType": "exec\x1b[31m", "error": HOSTILE_TEXT}

    fake.hook = hook
    r = analyze(url, data, timeout=60)
    line = one_line_error(r)
    assert "\x1b" not in r.stderr and "\r" not in r.stderr and "\u202e" not in r.stderr
    assert "boom\\x1b[2J\\x1b]0;pwned\\x07\\r\\nforged line\\u202e" in line, line


def test_escaped_warnings_and_instance_names(prom: tuple[FakePrometheus, str], data: Any) -> None:
    fake, url = prom

    def hook(path: str, form: dict[str, str], answer: dict[str, Any]) -> dict[str, Any] | None:
        if path == "/api/v1/series":
            answer["data"] = answer["data"] + [
                {"__name__": "vllm:prompt_tokens_total", "instance": "evil\x1b[2J:8000"}
            ]
        answer["warnings"] = [HOSTILE_TEXT]
        return None

    fake.hook = hook
    r = analyze(url, data, "--jobs", "1", timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\x1b" not in r.stdout + r.stderr and "\u202e" not in r.stdout + r.stderr
    assert "evil\\x1b[2J:8000" in r.stdout  # refused, under its escaped name
    assert "! boom\\x1b[2J" in r.stdout


# -- redirects --------------------------------------------------------------------------------
def _redirecting_app(here: FakePrometheus, elsewhere: str) -> web.Application:
    """/api/v1/…: answered here; /same/api/v1/…: redirected here; /other/api/v1/…: redirected
    to `elsewhere` (another host)."""

    async def redirect(request: web.Request) -> web.StreamResponse:
        tail = request.path.split("/api/v1/", 1)[1]
        target = elsewhere if request.path.startswith("/other/") else ""
        raise web.HTTPTemporaryRedirect(f"{target}/api/v1/{tail}")

    app = web.Application()
    app.router.add_route("*", "/same/api/v1/{tail:.*}", redirect)
    app.router.add_route("*", "/other/api/v1/{tail:.*}", redirect)
    app.router.add_route("*", "/api/v1/{tail:.*}", here.handle)
    return app


def test_headers_do_not_follow_a_redirect_to_another_host(data: Any, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    auth = ["--header", "X-Scope-OrgID: tenant1", "--header", "X-Api-Key: k"]
    auth += ["--bearer-token-file", str(token), "--jobs", "1", "--json"]
    other = FakePrometheus(data)
    for other_url in serve_in_thread(other.app(), host="127.0.0.2"):
        here = FakePrometheus(data)
        for url in serve_in_thread(_redirecting_app(here, other_url)):
            r = analyze(url + "/other", data, *auth, timeout=60)
            assert r.returncode == 0, r.stderr[-2000:]
            assert other.headers and not here.headers
            for headers in other.headers:  # the other host got none of them
                assert "X-Api-Key" not in headers and "X-Scope-OrgID" not in headers
                assert "Authorization" not in headers
            # A redirect within the host keeps them.
            r = analyze(url + "/same", data, *auth, timeout=60)
            assert r.returncode == 0, r.stderr[-2000:]
            assert here.headers
            for headers in here.headers:
                assert headers.get("X-Api-Key") == "k"
                assert headers.get("Authorization") == "Bearer s3cret"


def test_a_redirect_with_an_endless_body_is_followed_unread(data: Any) -> None:
    sent = type("Sent", (_Sent,), {})
    here = FakePrometheus(data)

    async def redirect(request: web.Request) -> web.StreamResponse:
        tail = request.path.split("/api/v1/", 1)[1]
        resp = web.StreamResponse(status=307, headers={"Location": f"/api/v1/{tail}"})
        await resp.prepare(request)
        await _write_without_end(resp, sent)
        return resp

    app = web.Application()
    app.router.add_route("*", "/moved/api/v1/{tail:.*}", redirect)
    app.router.add_route("*", "/api/v1/{tail:.*}", here.handle)
    for url in serve_in_thread(app):
        api = PrometheusAPI(url + "/moved", timeout=30)
        assert api.series("{}", 0, 60)  # followed, answered
    assert sent.bytes < 64 * 1024 * 1024


# -- values that are no figures ---------------------------------------------------------------
def _value_hook(bad: dict[str, str]) -> Any:
    """Two scrapes of every series of each instance in `bad` answered as that text ("+Inf"
    alternating with "-Inf" from series to series: main's fsum raised on them; two 1e308 in a
    sum overflow)."""

    def hook(path: str, form: dict[str, str], answer: dict[str, Any]) -> dict[str, Any] | None:
        data = answer.get("data")
        if isinstance(data, dict) and data.get("resultType") == "matrix":
            for i, s in enumerate(data["result"]):
                text = bad.get(s["metric"]["instance"])
                if text is not None and len(s["values"]) > 4:
                    text = "-Inf" if text == "+Inf" and i % 2 else text
                    s["values"][3][1] = s["values"][4][1] = text
        return None

    return hook


BAD_VALUES = {"a:8000": "+Inf", "b:8000": "1e308"}


def test_analyze_leaves_out_engines_with_values_that_are_no_figures(
    prom: tuple[FakePrometheus, str], data: Any
) -> None:
    fake, url = prom
    fake.hook = _value_hook(BAD_VALUES)
    r = analyze(url, data, "--json", "--jobs", "1", timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    errors = {e["instance"]: e["error"] for e in report["errors"]}
    assert set(errors) == set(BAD_VALUES)
    assert "inf at " in errors["a:8000"] and " is 1e+308 at " in errors["b:8000"]
    assert "not a vLLM figure" in errors["a:8000"]
    assert {g["labels"]["instance"] for g in report["groups"]} == {"c:8000"}
    # NaN and -Inf everywhere: one line, no traceback.
    fake.hook = _value_hook(dict.fromkeys(INSTANCES, "NaN"))
    line = one_line_error(analyze(url, data, timeout=60))
    assert "no instance could be read" in line and "is nan at" in line, line


def test_serve_reads_the_others_past_a_value_that_is_no_figure(
    prom: tuple[FakePrometheus, str], data: Any
) -> None:
    fake, url = prom
    fake.hook = _value_hook(BAD_VALUES)
    start, end = span(data)

    async def run() -> FleetService:
        service = FleetService(
            FleetConfig(fixed=(start, end), settings=Settings()), PrometheusAPI(url)
        )
        await service.refresh()
        return service

    service = asyncio.run(run())
    assert service.last_error is None and service.last is not None
    assert set(service.last.errors) == set(BAD_VALUES)
    assert {g.instance for g in service.groups()} == {"c:8000"}
    status = service.status()
    assert {t["instance"]: t["up"] for t in status["targets"]} == {  # type: ignore[index,union-attr]
        "a:8000": False,
        "b:8000": False,
        "c:8000": True,
    }
