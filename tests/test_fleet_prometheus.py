"""`analyze --prometheus`: the fleet read back from a real Prometheus gives the figures and the
advice `analyze FILE` gives for the same recordings (issue #15).

Recordings of several simulator scenarios (one a vLLM restart, one on the legacy metric names,
one stored under the `vllm_` underscore names, one process serving two models) and a real
vLLM 0.26 H200 capture are backfilled into one TSDB with promtool, and a Prometheus started
here serves them. Each instance's groups must match `analyze FILE` of its recording within 1%
per figure, with the same action and size, reading every sample or one point per step.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web

from kvoffload.recording.openmetrics import finalize_journal

from fleet_prom import backfill, prometheus_on
from helpers import certificates, free_port, h200_scrapes, recording_text

KVO = [sys.executable, "-m", "kvoffload"]

# instance → scenario (recorded 30 minutes at 15 s); "underscore" stores vllm_ names.
SIM = {
    "rag:8000": "rag-hot-set-fits",
    "restart:8000": "restart",
    "legacy:8000": "legacy-0.23",
    "twomodels:8000": "two-models",
    "underscore:8000": "buffer-too-small",
}
H200_INSTANCE = "h200:8000"


def kvo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=timeout)


def _underscore(path: Path) -> None:
    """The recording as a pipeline that escapes colons stores it: `vllm_…` names."""
    text = path.read_text()
    text = text.replace("\nvllm:", "\nvllm_").replace("# TYPE vllm:", "# TYPE vllm_")
    path.write_text(text)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sim_recording: Callable[..., tuple[Path, Path]]
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("fleet")
    tsdb = work / "tsdb"
    files: dict[str, Path] = {}
    for instance, name in SIM.items():
        _journal, out = sim_recording(name, instance)
        if instance.startswith("underscore"):  # the run's shared file stays as it is
            out = Path(shutil.copy(out, work / f"{name}.om"))
            _underscore(out)
        files[instance] = out
        backfill(out, tsdb)
    journal = work / "h200.journal"
    journal.write_text(recording_text(h200_scrapes("8b-offload"), instance=H200_INSTANCE))
    files[H200_INSTANCE] = work / "h200.om"
    finalize_journal(str(journal), str(files[H200_INSTANCE]))
    backfill(files[H200_INSTANCE], tsdb)
    spans = {i: _span(p) for i, p in files.items()}
    with prometheus_on(tsdb) as url:
        yield {"url": url, "files": files, "spans": spans, "work": work}


def _span(path: Path) -> tuple[float, float]:
    stamps = [
        float(line.rsplit(" ", 1)[1])
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return min(stamps), max(stamps)


def _analyze_file(path: Path) -> dict[str, Any]:
    r = kvo("analyze", str(path), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _analyze_prometheus(url: str, start: float, end: float, *extra: str) -> dict[str, Any]:
    r = kvo(
        "analyze", "--prometheus", url, "--start", f"{start}", "--end", f"{end}", "--json", *extra
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _close(a: object, b: object, path: str, diffs: list[str]) -> None:
    """Every number within 1% (or 1e-9 absolute, for zeros), every other leaf equal; reasons
    and warnings are prose with numbers in it and are left to the numbers they quote."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            if key in ("reasons", "warnings"):
                continue
            _close(a.get(key), b.get(key), f"{path}.{key}", diffs)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]", diffs)
    elif isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        if not math.isclose(a, b, rel_tol=0.01, abs_tol=1e-9):
            diffs.append(f"{path}: {a} vs {b}")
    elif a != b:
        diffs.append(f"{path}: {a!r} vs {b!r}")


def _by_key(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(g["labels"]["instance"], g["labels"]["model_name"]): g for g in report["groups"]}


@pytest.mark.slow
@pytest.mark.parametrize("step", [None, "15s"], ids=["every-sample", "step-15s"])
def test_same_figures_and_advice_as_the_recording(fleet: dict[str, Any], step: str | None) -> None:
    sim_start = min(fleet["spans"][i][0] for i in SIM)
    sim_end = max(fleet["spans"][i][1] for i in SIM)
    extra = ("--step", step) if step else ()
    from_prometheus = _by_key(_analyze_prometheus(fleet["url"], sim_start, sim_end, *extra))
    if step is None:  # the real capture's scrapes are irregular: only every sample fits them
        start, end = fleet["spans"][H200_INSTANCE]
        from_prometheus.update(_by_key(_analyze_prometheus(fleet["url"], start, end)))
    instances = list(SIM) + ([H200_INSTANCE] if step is None else [])
    compared = 0
    for instance in instances:
        expected = _by_key(_analyze_file(fleet["files"][instance]))
        assert expected
        for key, group in expected.items():
            got = from_prometheus.get(key)
            assert got is not None, f"{key} missing from the Prometheus analysis"
            assert got["recommendation"]["action"] == group["recommendation"]["action"], key
            diffs: list[str] = []
            _close(group, got, "", diffs)
            assert not diffs, f"{key}: " + "; ".join(diffs[:10])
            compared += 1
    assert compared >= len(instances) + 1  # two-models adds a second group


def test_fleet_summary_and_need_order(fleet: dict[str, Any]) -> None:
    start = min(fleet["spans"][i][0] for i in SIM)
    end = max(fleet["spans"][i][1] for i in SIM)
    report = _analyze_prometheus(fleet["url"], start, end, "--selector", '{job="vllm"}')
    groups = report["groups"]
    summary = report["fleet"]
    assert summary["engines"] == len(groups) == len(SIM) + 1
    actions: dict[str, int] = {}
    for g in groups:
        action = g["recommendation"]["action"]
        actions[action] = actions.get(action, 0) + 1
    assert summary["actions"] == actions
    configured = sum(g["figures"]["cpu_capacity_bytes"] or 0 for g in groups if g["offloading"])
    assert summary["configured_pinned_bytes"] == pytest.approx(configured)
    changes = {"enable", "grow", "shrink", "disable", "store_threshold"}
    tiers = [0 if g["recommendation"]["action"] in changes else 1 for g in groups]
    assert tiers == sorted(tiers), "engines that need a change come first"
    assert any(t == 0 for t in tiers), "buffer-too-small must ask for a change"
    assert report["errors"] == []

    r = kvo(
        "analyze",
        "--prometheus",
        fleet["url"],
        "--start",
        f"{start}",
        "--end",
        f"{end}",
        "--top",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\nmodel ") == 1 and "fleet: 6 engine(s)" in r.stdout
    assert "the 1 of 6 engines that most need a change" in r.stdout
    assert "read 5/5 instances" in r.stderr  # the progress line


def test_no_series_and_bad_input_are_one_line_errors(fleet: dict[str, Any]) -> None:
    start, end = fleet["spans"]["rag:8000"]
    span = ("--start", f"{start}", "--end", f"{end}")
    cases = {
        "no vLLM series": ["--prometheus", fleet["url"], "--selector", '{job="nope"}', *span],
        "label matchers in braces": [
            "--prometheus",
            fleet["url"],
            "--selector",
            'job="vllm"',
            *span,
        ],
        "unbalanced quotes": ["--prometheus", fleet["url"], "--selector", '{job="vllm}', *span],
        "Connection refused": ["--prometheus", f"http://127.0.0.1:{free_port()}", *span],
        "--end must be after --start": [
            "--prometheus",
            fleet["url"],
            "--start",
            f"{end}",
            "--end",
            f"{start}",
        ],
        "give one of FILE": [str(fleet["files"]["rag:8000"]), "--prometheus", fleet["url"]],
    }
    for expected, args in cases.items():
        r = kvo("analyze", *args)
        assert r.returncode == 2, (expected, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (expected, r.stderr)


# -- the APIs people run, through a proxy in front of the real Prometheus ------------------------

TOKEN = "s3cret"
BASIC = "Basic " + base64.b64encode(b"ops:" + TOKEN.encode()).decode()


def _proxy_app(upstream: str) -> web.Application:
    """Mimir-like: the API under /prometheus, a bearer token required. Questions about
    `legacy:8000` fail with an API error; questions about `twomodels:8000` never answer in
    time; every answer is reshaped the Prometheus 3 way (`infos`) and carries a warning."""

    async def handle(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") not in (f"Bearer {TOKEN}", BASIC):
            return web.Response(status=401, text="unauthorized\n")
        form = dict(await request.post())
        form.update(request.query)
        query = str(form.get("query", ""))
        if "legacy" in query:
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "boom"}, status=422
            )
        if "twomodels" in query:
            await asyncio.sleep(5)
        path = request.path[len("/prometheus") :]
        resp = await asyncio.to_thread(requests.post, upstream + path, data=form, timeout=30)
        body = resp.json()
        data = body.get("data")
        if isinstance(data, dict) and data.get("resultType") == "matrix":
            # A native histogram series (Prometheus 3): no float points, not vLLM's families.
            data["result"].append(
                {
                    "metric": {
                        "__name__": "vllm:time_to_first_token_seconds",
                        "instance": "rag:8000",
                    },
                    "histograms": [[1.0, {"count": "1", "sum": "0.5", "buckets": []}]],
                }
            )
        body["infos"] = ["PromQL info: a note that is not a warning"]
        body["warnings"] = ["partial response: store gateway 2 unreachable"]
        return web.json_response(body, status=resp.status_code)

    app = web.Application()
    app.router.add_route("*", "/prometheus/{tail:.*}", handle)
    return app


def _serve_in_thread(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> Iterator[int]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture
def proxy(fleet: dict[str, Any]) -> Iterator[str]:
    for port in _serve_in_thread(_proxy_app(fleet["url"])):
        yield f"http://127.0.0.1:{port}/prometheus"


@pytest.mark.slow
def test_errors_are_reported_per_engine_and_the_run_goes_on(
    fleet: dict[str, Any], proxy: str, tmp_path: Path
) -> None:
    start = min(fleet["spans"][i][0] for i in SIM)
    end = max(fleet["spans"][i][1] for i in SIM)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    span = ("--start", f"{start}", "--end", f"{end}")
    report = _analyze_prometheus(
        proxy, start, end, "--bearer-token-file", str(token), "--prometheus-timeout", "1s"
    )
    errors = {e["instance"]: e["error"] for e in report["errors"]}
    assert set(errors) == {"legacy:8000", "twomodels:8000"}, errors
    assert "execution: boom" in errors["legacy:8000"]
    assert "no complete answer within 1 s" in errors["twomodels:8000"]
    assert {g["labels"]["instance"] for g in report["groups"]} == {
        "rag:8000",
        "restart:8000",
        "underscore:8000",
    }
    assert report["warnings"] == ["partial response: store gateway 2 unreachable"]

    r = kvo("analyze", "--prometheus", proxy, *span)  # no token
    assert r.returncode == 2 and "HTTP 401" in r.stderr and len(r.stderr.splitlines()) == 1
    basic = ("--basic-auth-user", "ops", "--basic-auth-password-file", str(token))
    r = kvo("analyze", "--prometheus", proxy, *span, *basic, "--prometheus-timeout", "1s", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["groups"]) == 3


def test_worker_processes_give_what_one_process_gives(fleet: dict[str, Any]) -> None:
    """Batches analyzed in worker processes, merged, then compared across the fleet: the
    same groups, figures and advice as one process reading everything."""
    from kvoffload.analysis.analyze import Settings
    from kvoffload.fleet.promapi import PrometheusAPI
    from kvoffload.fleet.runs import analyze_from_prometheus
    from kvoffload.fleet.source import FleetReader

    start = min(fleet["spans"][i][0] for i in SIM)
    end = max(fleet["spans"][i][1] for i in SIM)
    runs = []
    for jobs in (1, 2):
        # A small budget: about one instance per batch (two-models in time chunks).
        reader = FleetReader(PrometheusAPI(fleet["url"]), start, end, point_budget=4_000)
        result = analyze_from_prometheus(reader, Settings(), jobs=jobs)
        assert result.stats.done == len(SIM) and result.stats.questions > len(SIM)
        runs.append(([g.to_json() for g in result.groups], result.summary.to_json()))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == len(SIM) + 1


@pytest.mark.slow
def test_tls_with_the_operators_ca(fleet: dict[str, Any], tmp_path: Path) -> None:
    ca, cert, key = certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    start, end = fleet["spans"]["rag:8000"]
    token = tmp_path / "token"
    token.write_text(TOKEN)
    for port in _serve_in_thread(_proxy_app(fleet["url"]), context):
        url = f"https://127.0.0.1:{port}/prometheus"
        common = ("--start", f"{start}", "--end", f"{end}", "--bearer-token-file", str(token))
        report = _analyze_prometheus(
            url, start, end, "--bearer-token-file", str(token), "--ca-file", str(ca)
        )
        assert "rag:8000" in {g["labels"]["instance"] for g in report["groups"]}
        r = kvo("analyze", "--prometheus", url, *common)  # the system CAs do not know ours
        assert r.returncode == 2 and "TLS" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        r = kvo("analyze", "--prometheus", url, *common, "--insecure-skip-verify", "--json")
        assert r.returncode == 0, r.stderr
