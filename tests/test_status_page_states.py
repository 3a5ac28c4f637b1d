"""The status page in a real headless Chromium in each state a user meets (#13 item 7): healthy
(advice, trends), no data yet ("waiting for data"), a target gone ("target down"), and with KV
events (the miss-ratio curve drawn with the current and advised sizes marked). Each state is
checked by its elements in the DOM after the page's script ran, and its screenshot is kept in
the test's tmp dir (tmp_path/<state>.png) for a look by eye."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from aiohttp import web

from kvoffload.analysis.window import Window
from kvoffload.kvevents.state import TargetEvents
from kvoffload.sidecar import http
from kvoffload.sidecar.history import HISTORY_KEY
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.server import make_app as make_sim_app

from helpers import FIXTURES, SAMPLE, free_port

PNG = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "link", "br", "img", "input", "hr", "area", "base", "col", "source", "wbr"}


# -- a small DOM, from what Chromium dumps ----------------------------------------------------
@dataclasses.dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        out = []
        for n in self.iter():
            if tag is not None and n.tag != tag:
                continue
            if cls is not None and cls not in n.classes():
                continue
            if any(n.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            out.append(n)
        return out

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, cls, **attrs)
        assert found, f"no <{tag or '*'} class={cls} {attrs}>"
        return found[0]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(dom: str) -> Node:
    b = _Builder()
    b.feed(dom)
    return b.root


# -- serving and loading ----------------------------------------------------------------------
# Appended to the page under test: each badge carries its computed colours in the DOM dump.
COLOURS = b"""<script>
new MutationObserver(() => {
  for (const e of document.querySelectorAll(".action")) {
    const cs = getComputedStyle(e);
    e.dataset.fg = cs.color;
    e.dataset.bg = cs.backgroundColor;
  }
}).observe(document.body, {childList: true, subtree: true});
</script>
</body>"""
WHITE = "rgb(255, 255, 255)"
BLUE = "rgb(9, 105, 218)"  # --wait
RED = "rgb(207, 34, 46)"  # --bad


@pytest.fixture(autouse=True)
def badge_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    page = http._page()
    assert page.count(b"</body>") == 1
    monkeypatch.setattr(http, "_page", lambda: page.replace(b"</body>", COLOURS))


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def load(chromium, url: str, screenshot: Path) -> Node:
    """The page's DOM after its script ran, and its screenshot, from one headless Chromium."""
    dom = await chromium.dom_async(url + "/", screenshot)
    assert 'data-loaded="true"' in dom, dom[-3000:]
    assert screenshot.read_bytes().startswith(PNG)
    return parse(dom)


async def wait_for(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def judged(sidecar: Sidecar, model: str) -> bool:
    return any(
        g.model_name == model and not g.recommendation.insufficient_data and not g.stale
        for g in sidecar.groups()
    )


def badge_of(card: Node) -> Node:
    (badge,) = card.find_all("span", cls="action")
    return badge


def groups(page: Node) -> dict[str, Node]:
    return {c.attrs["data-model"]: c for c in page.find_all("section", cls="group")}


SIM_SCENARIO = "h200-0.6b-eager-prefill-cpu4"  # a real H200 set: its tier costs TTFT
SIM_MODEL = "Qwen/Qwen3-0.6B"


async def _simulated(speed: float = 4.0) -> tuple[web.AppRunner, str]:
    return await _serve(make_sim_app(SimServer(scenarios.get(SIM_SCENARIO)), speed=speed))


# -- the states -------------------------------------------------------------------------------
async def _healthy(chromium, shot: Path) -> Node:
    sim_runner, sim_url = await _simulated()
    cgroup = _cgroup(shot.parent / "vllm-cgroup")
    sidecar = Sidecar(
        SidecarConfig([f"{sim_url}/metrics"], interval_seconds=0.2, host_memory=str(cgroup))
    )
    runner, url = await _serve(make_app(sidecar))
    try:
        await wait_for("advice", lambda: judged(sidecar, SIM_MODEL))
        after = sidecar.targets[0].scrapes + 5  # a few more scrapes in the trends
        await wait_for("more scrapes", lambda: sidecar.targets[0].scrapes >= after)
        return await load(chromium, url, shot)
    finally:
        await runner.cleanup()
        await sim_runner.cleanup()


def page_bytes(v: float) -> str:
    """The page's own rounding of bytes (fmt(v, "bytes") in index.html)."""
    units, i = ["B", "KB", "MB", "GB", "TB"], 0
    while abs(v) >= 1000 and i < len(units) - 1:
        v, i = v / 1000, i + 1
    return f"{v:.{2 if i else 0}f} {units[i]}"


def _cgroup(d: Path) -> Path:
    """vLLM's container as a cgroup v2 directory: 8 GiB held of a 16 GiB limit."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{10 * 2**30}\n")
    (d / "memory.max").write_text(f"{16 * 2**30}\n")
    (d / "memory.stat").write_text(f"anon {2 * 2**30}\nfile {8 * 2**30}\nshmem {6 * 2**30}\n")
    (d / "memory.events").write_text("oom 0\noom_kill 0\n")
    return d


def test_healthy_shows_advice_and_trends(chromium, tmp_path):
    page = asyncio.run(_healthy(chromium, tmp_path / "healthy.png"))
    card = groups(page)[SIM_MODEL]
    badge = badge_of(card)
    assert badge.attrs["data-state"] == "advice" and badge.text == "disable"
    assert badge.classes() == {"action", "disable"}
    assert badge.attrs["data-fg"] == WHITE
    # trends: a sparkline per headline figure that has values, each an inline SVG path
    trends = {t.attrs["data-trend"]: t for t in card.find_all("div", cls="trend")}
    assert {"offload_hit_ratio", "gpu_prefix_hit_ratio", "mean_ttft_seconds"} <= set(trends)
    for tile in trends.values():
        path = tile.find("svg", cls="spark").find("path")
        assert path.attrs["d"].startswith("M") and path.attrs["d"].count("L") >= 2
        assert tile.find("span", cls="now").text not in ("", "—")
    assert re.fullmatch(r"Trends, last \d+ s", card.find("h3").text)
    assert not card.find_all(id="trends-empty") and not card.find_all(id="curve-chart")
    # durations for people, and the targets' columns say what they hold
    meta = page.find("span", id="meta").text
    assert "scrape every 0.2 s" in meta and not re.search(r"\d\.\d{4,}", meta), meta
    headers = [th.text for th in page.find("table", id="targets").find_all("th")]
    assert headers == ["instance", "state", "last success", "scrape took", "error"]
    row = page.find("table", id="targets").find("tbody").find("tr").find_all("td")
    assert re.fullmatch(r"just now|[\d.]+ s ago", row[2].text), row[2].text
    assert row[3].text.endswith(" ms")
    # vLLM's container memory: 8 GiB unreclaimable (2 anon + 6 shared) of 16 GiB
    host = page.find("section", id="host-memory").text
    assert (
        "unreclaimable 8.59 GB" in host and "limit 17.18 GB" in host and "(50 % of it held)" in host
    )
    # offline: no asset from anywhere but the sidecar
    for n in page.iter():
        for attr in ("src", "href"):
            assert not n.attrs.get(attr, "").startswith(("http:", "https:", "//")), n.attrs


async def _no_data(chromium, shot: Path) -> Node:
    fixtures, fx_url = await _serve(_static_fixtures())
    # one snapshot served again and again: up, but nothing moves, never enough to judge
    sidecar = Sidecar(SidecarConfig([f"{fx_url}/{SAMPLE.name}"], interval_seconds=0.2))
    runner, url = await _serve(make_app(sidecar))
    try:
        await wait_for("a group", lambda: sidecar.ready and sidecar.groups())
        return await load(chromium, url, shot)
    finally:
        await runner.cleanup()
        await fixtures.cleanup()


def _static_fixtures() -> web.Application:
    app = web.Application()
    app.router.add_static("/", FIXTURES)
    return app


def test_no_data_says_waiting_for_data_not_keep(chromium, tmp_path):
    page = asyncio.run(_no_data(chromium, tmp_path / "no-data.png"))
    card = groups(page)["Qwen/Qwen3-Reranker-0.6B"]
    badge = badge_of(card)
    assert badge.text == "waiting for data" and badge.attrs["data-state"] == "waiting"
    assert badge.classes() == {"action", "waiting"}
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, BLUE)
    assert not page.find_all(cls="keep")  # no green "keep" while it cannot judge
    assert "too little data to judge" in card.text
    assert "--kv-offloading-size" not in card.text


async def _target_down(chromium, shot: Path) -> Node:
    sim_runner, sim_url = await _simulated()
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    sidecar = Sidecar(
        SidecarConfig([f"{sim_url}/metrics", dead], interval_seconds=0.2, timeout_seconds=1)
    )
    runner, url = await _serve(make_app(sidecar))
    try:
        await wait_for("advice", lambda: judged(sidecar, SIM_MODEL))
        after = sidecar.targets[0].scrapes + 3
        await wait_for("more scrapes", lambda: sidecar.targets[0].scrapes >= after)
        await sim_runner.cleanup()  # vLLM goes away
        await wait_for("the target down", lambda: not sidecar.targets[0].up)
        # the trends record the gap: a few failed scrapes after the first
        after = sidecar.targets[0].failures + 3
        await wait_for("failed scrapes", lambda: sidecar.targets[0].failures >= after)
        return await load(chromium, url, shot)
    finally:
        await runner.cleanup()


def test_target_down_says_target_down_with_the_last_advice(chromium, tmp_path):
    page = asyncio.run(_target_down(chromium, tmp_path / "target-down.png"))
    card = groups(page)[SIM_MODEL]
    badge = badge_of(card)
    assert badge.text == "target down" and badge.attrs["data-state"] == "down"
    assert badge.classes() == {"action", "target-down"}
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, RED)
    assert card.find("span", cls="was").text == "last advice: disable"
    assert "STALE: target down" in card.text
    # the trends end in a gap, the last value shown as down
    tile = card.find("div", data_trend="offload_hit_ratio")
    assert re.fullmatch(r"\d+\.\d %, then down", tile.find("span", cls="now").text)
    rows = {
        r.attrs["data-instance"]: r for r in page.find("table", id="targets").find_all("tr")[1:]
    }
    assert all(r.find_all("td")[1].text == "down" for r in rows.values())
    assert any("cannot connect" in r.text for r in rows.values())


async def _all_down(chromium, shot: Path) -> Node:
    sidecar = Sidecar(
        SidecarConfig(
            [f"http://127.0.0.1:{free_port()}/metrics"], interval_seconds=0.2, timeout_seconds=1
        )
    )
    runner, url = await _serve(make_app(sidecar))
    try:
        await wait_for("a failed scrape", lambda: sidecar.targets[0].failures > 0)
        return await load(chromium, url, shot)
    finally:
        await runner.cleanup()


def test_no_engine_and_every_target_down(chromium, tmp_path):
    page = asyncio.run(_all_down(chromium, tmp_path / "all-down.png"))
    card = page.find("section", id="no-groups")
    badge = badge_of(card)
    assert badge.text == "target down"
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, RED)
    assert not page.find_all("section", cls="group")


INSTANCE = "sim:8000"


def _with_events(scenario: str, seconds: float) -> tuple[Window, TargetEvents]:
    """A simulated run's window and KV-event state, as the sidecar would hold them."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "kvevents"))
    from kv_helpers import run_with_events

    sc = dataclasses.replace(scenarios.get(scenario), duration_s=seconds)
    window, state, _ = run_with_events(sc)
    return window, state


async def _kv_events(chromium, shot: Path) -> tuple[Node, dict]:
    # A RAG service whose CPU tier is the size of its GPU cache: the curve says grow.
    window, state = _with_events("buffer-too-small", 300.0)
    sidecar = Sidecar(SidecarConfig([f"http://{INSTANCE}/metrics"], interval_seconds=0.2))
    sidecar.window = window
    sidecar.events[INSTANCE] = state
    sidecar.reanalyse()  # (groups are analyzed as scrapes land; these were built here)
    target = sidecar.targets[0]
    target.up, target.last_success_timestamp, target.scrapes = True, time.time(), 21
    app = make_app(sidecar, manage_lifecycle=False)
    # what the sidecar kept of the figures before the page opened: the page starts from it
    for i in range(30):
        app[HISTORY_KEY].sample(sidecar.groups(), time.time() - 60 + 2 * i)
    runner, url = await _serve(app)
    try:
        page = await load(chromium, url, shot)
        return page, sidecar.status()
    finally:
        await runner.cleanup()


def test_kv_events_curve_chart_marks_current_and_advised(chromium, tmp_path):
    page, status = asyncio.run(_kv_events(chromium, tmp_path / "kv-events.png"))
    (group,) = status["groups"]
    rec = group["recommendation"]
    assert rec["action"] == "grow" and rec["kv_offloading_size_gib"]
    advised = rec["kv_offloading_size_gib"]
    current = group["figures"]["cpu_capacity_bytes"] / 2**30
    card = groups(page)[group["labels"]["model_name"]]
    assert badge_of(card).text == "grow"
    chart = card.find("svg", id="curve-chart")
    assert chart.find("path", cls="curve").attrs["d"].count("L") >= 4
    marks = {m.attrs["data-mark"]: m for m in chart.find_all("g") if "data-mark" in m.attrs}
    assert set(marks) == {"current", "advised", "achievable"}
    assert float(marks["current"].attrs["data-gib"]) == pytest.approx(current)
    assert float(marks["advised"].attrs["data-gib"]) == advised
    assert marks["advised"].find("text").text.startswith(f"advised {advised:g} GiB · ")
    assert marks["current"].find("text").text.startswith("current 2 GiB · ")
    # the advised line right of the current one
    x = {k: float(m.find("line").attrs["x1"]) for k, m in marks.items() if k != "achievable"}
    assert x["current"] < x["advised"]
    # the table: each size once, the advised size among them, a flat run as one row
    rows = card.find("table", id="curve").find_all("tr")[1:]
    sizes = [r.find_all("td")[0].text for r in rows]
    assert len(sizes) == len(set(sizes)), sizes
    marked = {
        r.attrs["data-marks"]: r.find_all("td")[0].text for r in rows if r.attrs["data-marks"]
    }
    assert marked == {"current": "2 GiB", "advised": f"{advised:g} GiB"}
    assert sizes[-1].endswith("and up")
    ratios = [r.find_all("td")[1].text for r in rows]
    marks_of = [r.attrs["data-marks"] for r in rows]
    for i in range(1, len(rows)):
        assert ratios[i] != ratios[i - 1] or marks_of[i] or marks_of[i - 1], (sizes, ratios)
    # trends from the sidecar's history (GET api/v1/history), before any poll of the page
    trends = card.find_all("div", cls="trend")
    assert trends and all(t.find("path").attrs["d"].count("L") >= 20 for t in trends)
    # no absent part written as the text "null" (DOM append does that with a null)
    assert "null" not in card.text
    # with KV events the exact bytes never loaded replace the counters' lower bound
    ev = group["kv_events"]
    exact = ev["never_loaded_evicted_bytes"] + (ev["never_loaded_resident_bytes"] or 0)
    wasted = card.find("tr", data_figure="wasted_bytes").find_all("td")
    assert wasted[0].text == "Stored, never loaded back (exact, KV events)"
    assert exact > 0 and wasted[1].text == page_bytes(exact)
