"""The status page: a real headless Chromium loads it over a sidecar with a mix of targets;
its body fragment, its history (kept long, thinned) and its rounding for people."""

import asyncio
import itertools
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from kvoffload.kvevents.decode import decode_batch
from kvoffload.kvevents.state import TargetEvents
from kvoffload.sidecar.history import History
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.page_html import fmt, secs, tag
from kvoffload.sidecar.service import Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.kv_events import encode_batch
from kvoffload.sim.server import make_app as make_sim_app

from helpers import FIXTURES, SAMPLE, free_port


def laptop_events() -> TargetEvents:
    sim = SimServer(scenarios.get("laptop-eviction"), kv_events=True)
    sim.advance_to(120.0)
    state = TargetEvents()
    for seq, (rank, ts, events) in enumerate(sim.drain_kv_events()):
        state.ingest(decode_batch(encode_batch(ts, events, rank)), seq, rank)
    return state


async def _dump_dom(chromium, screenshot: str | None = None) -> str:
    # KV events of the laptop scenario (the sample's shapes), as if subscribed, with a gap
    # vLLM could not replay: the curve is provisional. Made first: it takes seconds, and the
    # simulated server's 400 requests start when it is served (a sidecar scraping only after
    # they are over would see no traffic in its window).
    events = laptop_events()
    events.engines[0].lost_messages = 3
    fixtures = web.Application()
    fixtures.router.add_static("/", FIXTURES)
    fx_runner = web.AppRunner(fixtures)
    await fx_runner.setup()
    fx_port = free_port()
    await web.TCPSite(fx_runner, "127.0.0.1", fx_port).start()
    # A simulated real H200 set (Qwen3-0.6B eager with a 4 GiB tier that hits but costs TTFT),
    # 4x faster than real time: 400 requests in ~2.5 s, enough for the TTFT verdict.
    sim_runner = web.AppRunner(
        make_sim_app(SimServer(scenarios.get("h200-0.6b-eager-prefill-cpu4")), speed=4.0)
    )
    await sim_runner.setup()
    sim_port = free_port()
    await web.TCPSite(sim_runner, "127.0.0.1", sim_port).start()
    sidecar = Sidecar(
        SidecarConfig(
            [
                f"http://127.0.0.1:{fx_port}/{SAMPLE.name}",
                f"http://127.0.0.1:{free_port()}/metrics",
                f"http://127.0.0.1:{sim_port}/metrics",
            ],
            interval_seconds=0.2,
            timeout_seconds=1,
        )
    )
    sidecar.events[sidecar.targets[0].name] = events
    runner = web.AppRunner(make_app(sidecar))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        for _ in range(100):
            judged = [
                g
                for g in sidecar.groups()
                if g.model_name == "Qwen/Qwen3-0.6B" and not g.recommendation.insufficient_data
            ]
            if sidecar.ready and all(t.scrapes for t in sidecar.targets) and judged:
                break
            await asyncio.sleep(0.1)
        return await chromium.dom_async(f"http://127.0.0.1:{port}/", screenshot)
    finally:
        await runner.cleanup()
        await fx_runner.cleanup()
        await sim_runner.cleanup()


def test_status_page_renders_in_chromium(chromium):
    dom = asyncio.run(_dump_dom(chromium))
    assert 'data-loaded="true"' in dom and 'id="page"' in dom
    assert 'data-model="Qwen/Qwen3-Reranker-0.6B"' in dom
    # too few requests to judge: the badge says so, no green "keep" (test_status_page_states)
    assert 'class="action waiting"' in dom and ">waiting for data<" in dom
    assert 'class="action keep"' not in dom
    # the TTFT verdict on the simulated eager 0.6B engine: its tier hits but costs TTFT
    assert 'data-model="Qwen/Qwen3-0.6B"' in dom and 'class="action disable"' in dom
    assert 'data-ttft="now"' in dom and "TTFT effect of the CPU tier now" in dom
    assert 'data-ttft="change"' in dom and "measured" in dom and "costs TTFT" in dom
    assert "4,672 tokens" in dom  # CPU capacity, rendered by the page's script
    assert "cannot connect" in dom  # the dead target is shown with its error
    assert 'id="curve"' in dom and "current" in dom  # the KV-event curve, current size marked
    assert 'id="curve-chart"' in dom and 'data-mark="current"' in dom  # ... and drawn
    assert 'id="provisional"' in dom and "3 lost in gaps" in dom


def test_history_keeps_the_whole_run_thinned():
    """A day of 5 s scrapes (17,280 samples) is kept as at most 240, evenly spaced, from the
    first sample to the newest."""
    sidecar = Sidecar(SidecarConfig(["http://sim:8000/metrics"], interval_seconds=5))
    sidecar.window = _laptop_window()
    sidecar.targets[0].up = True  # as if scraped (the window was built here)
    sidecar.reanalyze()
    history, start = History(), 1_000_000.0
    for i in range(17_280):
        history.sample(sidecar.groups(), start + 5 * i)
    (group,) = history.snapshot().values()
    t = group["t"]
    assert 120 < len(t) <= 240
    assert t[0] == start and t[-1] >= start + 5 * 17_280 - 5 * group["stride"]
    steps = {round(b - a, 1) for a, b in itertools.pairwise(t)}
    assert steps == {5.0 * group["stride"]}, steps
    assert set(group["advice"]) == {sidecar.groups()[0].recommendation.action}
    assert all(len(v) == len(t) for v in group["figures"].values())


def _laptop_window():
    sys.path.insert(0, str(Path(__file__).parent / "kvevents"))
    from kv_helpers import run_with_events

    window, _, _ = run_with_events("laptop-eviction")
    return window


def test_numbers_for_people():
    assert secs(0.11666666666666667) == "117 ms"
    assert [secs(v) for v in (5, 0.2, 59.94, 300, 7200, 0, 3.93e-5)] == [
        "5 s", "200 ms", "59.9 s", "5 min", "2 h", "0 s", "39.3 µs",
    ]  # fmt: skip
    assert fmt(57.3e9, "bytes") == "57.30 GB" and fmt(0, "bytes") == "0 B"
    assert fmt(0.1234, "pct") == "12.3 %" and fmt(None, "pct") == "—"
    assert fmt(float("nan"), "s") == "—" and fmt(4672.4, "tokens") == "4,672 tokens"


def test_text_is_escaped_and_absent_parts_left_out():
    assert tag("td", {"title": 'a"b'}, "<script>", None) == (
        '<td title="a&quot;b">&lt;script&gt;</td>'
    )


async def _fragment() -> tuple[str, str, str]:
    fixtures = web.Application()
    fixtures.router.add_static("/", FIXTURES)
    fx_runner = web.AppRunner(fixtures)
    await fx_runner.setup()
    fx_port = free_port()
    await web.TCPSite(fx_runner, "127.0.0.1", fx_port).start()
    sidecar = Sidecar(
        SidecarConfig([f"http://127.0.0.1:{fx_port}/{SAMPLE.name}"], interval_seconds=0.2)
    )
    runner = web.AppRunner(make_app(sidecar, metrics_path="/prefix/metrics"))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        deadline = time.monotonic() + 30
        while not (sidecar.ready and sidecar.groups()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/") as r:
                whole, cache = await r.text(), r.headers["Cache-Control"]
                assert r.headers["Content-Encoding"] in ("gzip", "deflate", "br")
            async with s.get(f"http://127.0.0.1:{port}/?part=body") as r:
                assert r.content_type == "text/html"
                body = await r.text()
        return whole, body, cache
    finally:
        await runner.cleanup()
        await fx_runner.cleanup()


def test_body_fragment_is_what_the_page_holds():
    whole, body, cache = asyncio.run(_fragment())
    assert cache == "no-store"
    assert whole.startswith("<!doctype html>") and "<!--body-->" not in whole
    assert not body.startswith("<!doctype") and "<script" not in body
    for part in ('id="groups"', 'data-model="Qwen/Qwen3-Reranker-0.6B"', 'id="targets"'):
        assert part in body and part in whole
    assert 'href="prefix/metrics"' in body  # relative to the page, as --web.telemetry-path


def test_the_warmups_placeholder_is_waiting_in_the_advice_trend(tmp_path: Path) -> None:
    """During the warm-up the published advice holds the current state (analysis.stability);
    the trend says "waiting" for it, not a kept or left-off tier (README walk-through)."""
    import lzma
    from dataclasses import replace

    from kvoffload.analysis.analyze import Settings, analyze_groups, window_from_recording
    from kvoffload.sidecar.history import advice_state

    rec = tmp_path / "rec.om"
    rec.write_bytes(
        lzma.decompress((FIXTURES / "vllm-0.26-h200-tiering" / "rec.om.xz").read_bytes())
    )
    (group,) = analyze_groups(window_from_recording(str(rec))[0], Settings())
    assert advice_state(group) == group.recommendation.action == "disable"
    warming = replace(group, recommendation=replace(group.recommendation, decided_by="warmup"))
    assert advice_state(warming) == "waiting"


def test_the_card_shows_the_knobs_whatifs(tmp_path: Path) -> None:
    """The what-if rows of the KV events (here a real vLLM 0.26 capture's, replayed) become a
    table on the group's card: store_threshold 1-4 and ARC at the current size, with the basis."""
    import lzma

    from kvoffload.kvevents.whatif import whatif_for_file
    from kvoffload.sidecar.page_group import whatif_block

    events = tmp_path / "E-cpu4.kvev"
    source = FIXTURES / "vllm-0.26-h200-ttft" / "E" / "E-cpu4.kvev.xz"
    events.write_bytes(lzma.decompress(source.read_bytes()))
    rows = whatif_for_file(str(events), 2_359_296.0, 16, {"current": 4 * 2**30}).to_json()
    html = str(whatif_block({"kv_events": {"whatif": rows}}))
    assert html.count("<tr>") == 1 + 4 + 1 + 1  # the head, N = 1..4, ARC, an fs tier below
    assert "an fs tier below" in html
    n2 = next(r for r in rows["store_threshold"] if r["store_threshold"] == 2)
    assert fmt(n2["cpu_hit_ratio"], "pct") in html and fmt(n2["stored_bytes"], "bytes") in html
    assert "eviction_policy arc" in html and "exact replay of vLLM 0.26.0" in html
    assert whatif_block({"kv_events": {}}) is None and whatif_block({}) is None


def test_the_card_shows_each_secondary_tier_apart() -> None:
    """A group with two tiers (the JSON's `tiers`) gets one row each, in the tier's own figures."""
    from kvoffload.sidecar.page_group import tiers_block

    fs = {"tier_hit_ratio": 0.8, "tier_read_gbps": 6.0, "tier_promotion_failures_per_second": 0}
    obj = {"tier_hit_ratio": 0.4, "tier_read_gbps": 1.5, "tier_write_gbps": None}
    html = str(tiers_block({"tiers": {"1:fs": fs, "2:obj": obj}}))
    assert html.count("<tr") == 1 + 2 and 'data-tier="2:obj"' in html
    assert "80.0 %" in html and "1.50 GB/s" in html and "—" in html
    assert tiers_block({"tiers": {}}) is None and tiers_block({}) is None
