"""The sidecar end to end over loopback: good and misbehaving targets, its HTTP endpoints."""

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from kvoffload.ingest.parse import parse_text
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.metrics import build_registry
from kvoffload.sidecar.service import Sidecar, SidecarConfig

from badserver import make_bad_app
from helpers import free_port, until

BAD = ["500", "slow", "truncated", "garbage", "huge", "notvllm"]


async def _serve(app: web.Application, hosts=("127.0.0.1",)) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    for host in hosts:
        await web.TCPSite(runner, host, port).start()
    return runner, port


def run(coro):
    return asyncio.run(coro)


async def _sidecar_against_bad_targets():
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"]
    bad_runner, bad_port = await _serve(make_bad_app(), ["127.0.0.1", *hosts])
    dead_port = free_port()  # nothing listens here
    base = f"http://127.0.0.1:{bad_port}"
    targets = [f"{base}/ok"] + [f"http://127.0.0.7:{bad_port}/{p}" for p in BAD[:1]]
    # Each misbehaving route gets its own loopback address so instances stay distinct.
    targets += [f"http://{h}:{bad_port}/{p}" for h, p in zip(hosts[:5], BAD[1:], strict=True)]
    targets.append(f"http://127.0.0.1:{dead_port}/metrics")
    sidecar = Sidecar(
        SidecarConfig(
            targets,
            interval_seconds=0.2,
            window_seconds=60,
            timeout_seconds=1.0,
            max_payload_bytes=1_000_000,
        )
    )
    runner, port = await _serve(make_app(sidecar))
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(50):
                await asyncio.sleep(0.2)
                async with s.get(f"http://127.0.0.1:{port}/api/v1/status") as r:
                    status = await r.json()
                if (
                    all(t["scrapes"] >= 2 for t in status["targets"])
                    and status["groups"]
                    and status["groups"][0]["window_seconds"] > 0
                ):
                    break
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                metrics = await r.text()
            async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                health = r.status
            async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                ready = r.status
            async with s.get(f"http://127.0.0.1:{port}/") as r:
                page = await r.text()
    finally:
        await runner.cleanup()
        await bad_runner.cleanup()
    return status, metrics, health, ready, page


def test_bad_targets_are_down_with_one_line_errors_and_the_good_one_serves():
    status, metrics, health, ready, page = run(_sidecar_against_bad_targets())
    by_url = {t["url"].rsplit("/", 1)[1]: t for t in status["targets"]}
    assert by_url["ok"]["up"] is True and by_url["ok"]["last_error"] is None
    expected = {
        "500": "HTTP 500",
        "slow": "timed out",
        "truncated": "truncated",
        "garbage": "not text",
        "huge": "exceeds",
        "notvllm": "no vLLM metrics",
        "metrics": "cannot connect",
    }
    for route, words in expected.items():
        t = by_url[route]
        assert t["up"] is False, route
        assert words in t["last_error"], (route, t["last_error"])
        assert "\n" not in t["last_error"]
    assert health == 200 and ready == 200
    assert "kvoffload" in page

    samples = {(n, tuple(sorted(lb.items()))): v for n, lb, v, _ in parse_text(metrics).samples}
    ok_name = by_url["ok"]["instance"]
    assert samples[("kvoffload_up", (("target", ok_name),))] == 1.0
    assert samples[("kvoffload_up", (("target", by_url["500"]["instance"]),))] == 0.0
    # The sample is static, so over the window nothing moved: ratios are undefined (absent),
    # capacities (static) are present.
    group = (("model_name", "Qwen/Qwen3-Reranker-0.6B"), ("target", ok_name))
    assert samples[("kvoffload_cpu_capacity_tokens", group)] == 4672
    assert ("kvoffload_offload_hit_ratio", group) not in samples
    assert samples[("kvoffload_recommendation", (("action", "keep"), *group))] == 1.0
    assert samples[("kvoffload_recommendation", (("action", "grow"), *group))] == 0.0


def test_own_metrics_follow_prometheus_conventions():
    sidecar = Sidecar(SidecarConfig(["http://127.0.0.1:1/metrics"]))
    from prometheus_client import generate_latest

    from kvoffload.sidecar.metrics import build_registry

    text = generate_latest(build_registry(sidecar)).decode()
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    types = {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")
    }
    assert helps == set(types)
    for name, mtype in types.items():
        # Its own families, and the process and Python self-metrics every exporter has.
        assert name.startswith(("kvoffload_", "process_", "python_")), name
        assert ":" not in name
        assert name.endswith("_total") == (mtype == "counter"), name


async def _readyz_before_first_scrape():
    sidecar = Sidecar(
        SidecarConfig([f"http://127.0.0.1:{free_port()}/metrics"], interval_seconds=60)
    )
    runner, port = await _serve(make_app(sidecar, manage_lifecycle=False))
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/readyz") as r:
            return r.status
    finally:
        await runner.cleanup()


def test_readyz_is_503_before_any_successful_scrape():
    assert run(_readyz_before_first_scrape()) == 503


def test_metrics_reference_is_generated_and_current():
    from pathlib import Path

    from kvoffload.sidecar.metrics_doc import metrics_markdown

    doc = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    assert doc == metrics_markdown(), "regenerate: make generate"


def _published(sidecar: Sidecar, text: str) -> str | None:
    """The sidecar's /metrics body once it has `text`, None before."""
    body = generate_latest(build_registry(sidecar)).decode()
    return body if text in body else None


async def _target_goes_down():
    from helpers import SAMPLE, running

    body = SAMPLE.read_bytes()
    app = web.Application()

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    async with running(app) as vllm_port:
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://127.0.0.1:{vllm_port}/metrics"], interval_seconds=0.1, timeout_seconds=0.5
            )
        )
        await sidecar.start()
        before = await until(
            "the figures published",
            lambda: _published(sidecar, "kvoffload_cpu_capacity_tokens{"),
        )
    # The vLLM server is gone now: a scrape fails, and then the figures go.
    failed = sidecar.targets[0].failures
    await until("a failed scrape", lambda: sidecar.targets[0].failures > failed)
    after = generate_latest(build_registry(sidecar)).decode()
    status = sidecar.status()
    await sidecar.stop()
    return before, after, status


def test_a_target_that_goes_down_stops_publishing_figures():
    before, after, status = asyncio.run(_target_goes_down())
    assert "kvoffload_cpu_capacity_tokens{" in before
    assert "kvoffload_cpu_capacity_tokens{" not in after
    assert "kvoffload_up{" in after and status["groups"][0]["stale"] is True


def test_help_of_the_sidecar_series_comes_from_the_one_table():
    """docs/metrics.md and /metrics read the same table (sidecar/metrics.py): no copy drifts."""
    import re

    from prometheus_client import generate_latest

    from kvoffload.sidecar.metrics import ADVICE_METRICS, TARGET_METRICS, build_registry

    sidecar = Sidecar(SidecarConfig(["http://127.0.0.1:9/metrics"]))
    body = generate_latest(build_registry(sidecar)).decode()
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", body, re.M))
    for name, (mtype, _labels, help_text) in {**TARGET_METRICS, **ADVICE_METRICS}.items():
        shown = f"{name}_total" if mtype == "counter" else name
        assert helps[shown] == help_text, name
