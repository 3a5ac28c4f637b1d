"""The status page in a real headless Chromium in the six states a user meets (#13 item 7,
#27 item 4): keep, enable, disable, target down, provisional (the KV events' curve still warming
up) and no data ("waiting for data"). Each state is loaded twice: with scripts blocked (the
server-rendered first paint must hold the verdict, its reasons, the figures and the charts) and
with scripts on past the page's 5 s refresh (the body swapped in by its script says the same,
and the badges' computed colours are read). Screenshots are kept in the test's tmp dir
(tmp_path/<state>.png, <state>-nojs.png) for a look by eye."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from aiohttp import web

from kvoffload.analysis.window import Window
from kvoffload.kvevents.state import TargetEvents
from kvoffload.sidecar import page as page_module
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
# Put into the page under test: each badge carries its computed colours in the DOM dump, on
# the first paint and again on each body the page's script swaps in.
COLOURS = """<script>
function paint() {
  for (const e of document.querySelectorAll(".action")) {
    const cs = getComputedStyle(e);
    e.dataset.fg = cs.color;
    e.dataset.bg = cs.backgroundColor;
  }
}
paint();
new MutationObserver(paint).observe(document.body, {childList: true, subtree: true});
</script>
</body>"""
WHITE = "rgb(255, 255, 255)"
BLUE = "rgb(9, 105, 218)"  # --wait
RED = "rgb(207, 34, 46)"  # --bad
GREEN = "rgb(26, 127, 55)"  # --ok
AMBER = "rgb(154, 103, 0)"  # --warn
# Scripts blocked the way a browser does it for a site's policy (headless Chromium's own
# --blink-settings=scriptEnabled=false stops it dumping the DOM at all).
NO_SCRIPTS = "script-src 'none'"
# Past the page's 5 s refresh (the shared flags give 5 s of virtual time, the refresh's edge).
PAST_A_REFRESH = "--virtual-time-budget=12000"


@pytest.fixture(autouse=True)
def badge_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    text = page_module.template()
    assert text.count("</body>") == 1
    monkeypatch.setattr(page_module, "template", lambda: text.replace("</body>", COLOURS))


@web.middleware
async def scripts_off(request: web.Request, handler) -> web.StreamResponse:
    """?scripts=off: the response forbids every script (Content-Security-Policy)."""
    resp = await handler(request)
    if request.query.get("scripts") == "off":
        resp.headers["Content-Security-Policy"] = NO_SCRIPTS
    return resp


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    app.middlewares.append(scripts_off)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _dump(chromium, url: str, shot: Path, extra: list[str]) -> str:
    """The DOM Chromium ends with (its shared flags, plus `extra` in place of theirs)."""
    with tempfile.TemporaryDirectory() as profile:
        argv = chromium.argv(url, profile, shot)
        names = {a.split("=")[0] for a in extra}
        argv = [argv[0], *extra, *(a for a in argv[1:] if a.split("=")[0] not in names)]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert shot.read_bytes().startswith(PNG)
    return out.decode()


@dataclasses.dataclass
class Loaded:
    first: Node  # scripts blocked: the server-rendered first paint alone
    refreshed: Node  # scripts on, after the page's script swapped in a fresh body

    def both(self) -> tuple[Node, Node]:
        return self.first, self.refreshed


async def load(chromium, url: str, shot: Path) -> Loaded:
    """The page with scripts blocked, then with them on past a refresh; both screenshots."""
    nojs = shot.with_name(shot.stem + "-nojs.png")
    first = await _dump(chromium, url + "/?scripts=off", nojs, [])
    refreshed = await _dump(chromium, url + "/", shot, [PAST_A_REFRESH])
    # no script ran (neither the page's refresh nor the colours put in by this test)
    assert 'id="page"' in first and "data-refreshed" not in first and "data-fg" not in first
    assert re.search(r'data-refreshed="[1-9]', refreshed), refreshed[-2000:]
    loaded = Loaded(parse(first), parse(refreshed))
    for page in loaded.both():
        readable(page)
    return loaded


def readable(page: Node) -> None:
    """What any state shows: no absent part as text, numbers rounded, nothing from outside."""
    text = page.find("div", id="page").text
    assert not re.search(r"\b(null|undefined|NaN)\b", text), text
    assert not re.search(r"\d\.\d{5,}", text), re.findall(r".{40}\d\.\d{5,}.{20}", text)
    for n in page.iter():
        for attr in ("src", "href"):
            assert not n.attrs.get(attr, "").startswith(("http:", "https:", "//")), n.attrs


def trends_drawn(card: Node, names: set[str]) -> dict[str, Node]:
    """The card's trend charts: each with a line, value labels and times on its axes."""
    tiles = {t.attrs["data-trend"]: t for t in card.find_all("div", cls="trend")}
    assert names <= set(tiles), set(tiles)
    for tile in tiles.values():
        chart = tile.find("svg", cls="trend-chart")
        assert chart.find("path", cls="line").attrs["d"].count("L") >= 2
        labels = [t.text for t in chart.find("g", cls="axis").find_all("text")]
        times = [x for x in labels if re.fullmatch(r"\d\d:\d\d:\d\d", x)]
        assert len(times) >= 2 and len(labels) - len(times) == 3, labels
        assert tile.find("span", cls="now").text not in ("", "—")
    heading = card.find("div", cls="trends-block").find("h3").text
    assert re.fullmatch(
        r"Trends, last [\d.]+ (ms|s|min|h) \(from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", heading
    ), heading
    return tiles


def advice_over_time(card: Node) -> list[str]:
    """The states of the advice trend's runs, oldest first, and its "since" line."""
    trend = card.find("div", id="advice-trend")
    runs = [r.attrs["data-state"] for r in trend.find("svg", id="advice-chart").find_all("rect")]
    assert re.fullmatch(
        r"\S+ since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", trend.find_all("li")[-1].text
    ), trend.text
    return runs


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


def page_bytes(v: float) -> str:
    """Bytes as the page rounds them (sidecar.page_html.fmt, decimal units)."""
    units, i = ["B", "KB", "MB", "GB", "TB"], 0
    while abs(v) >= 1000 and i < len(units) - 1:
        v, i = v / 1000, i + 1
    return f"{v:.{2 if i else 0}f} {units[i]}"


SIM_SCENARIO = "h200-0.6b-eager-prefill-cpu4"  # a real H200 set: its tier costs TTFT
SIM_MODEL = "Qwen/Qwen3-0.6B"
INSTANCE = "sim:8000"


async def _simulated(speed: float = 4.0) -> tuple[web.AppRunner, str]:
    return await _serve(make_sim_app(SimServer(scenarios.get(SIM_SCENARIO)), speed=speed))


def _with_events(scenario: str, seconds: float | None) -> tuple[Window, TargetEvents]:
    """A simulated run's window and KV-event state, as the sidecar would hold them."""
    sys.path.insert(0, str(Path(__file__).parent / "kvevents"))
    from kv_helpers import run_with_events

    sc = scenarios.get(scenario)
    if seconds is not None:
        sc = dataclasses.replace(sc, duration_s=seconds)
    window, state, _ = run_with_events(sc)
    return window, state


async def _offline(chromium, shot: Path, scenario: str, seconds: float | None = None):
    """A simulated run with KV events, as a sidecar that scraped and subscribed holds it, and
    the page after the sidecar kept a minute of its trends; (page, status)."""
    window, state = _with_events(scenario, seconds)
    sidecar = Sidecar(SidecarConfig([f"http://{INSTANCE}/metrics"], interval_seconds=1))
    sidecar.window = window
    sidecar.events[INSTANCE] = state
    sidecar.reanalyze()  # (groups are analyzed as scrapes land; these were built here)
    target = sidecar.targets[0]
    target.up, target.last_success_timestamp, target.scrapes = True, time.time(), 21
    target.last_scrape_duration_seconds = 0.0123
    app = make_app(sidecar, manage_lifecycle=False)
    for i in range(30):
        app[HISTORY_KEY].sample(sidecar.groups(), time.time() - 60 + 2 * i)
    runner, url = await _serve(app)
    try:
        return await load(chromium, url, shot), sidecar.status()
    finally:
        await runner.cleanup()


def _exact_never_loaded(card: Node, group: dict) -> None:
    """With KV events the exact bytes never loaded replace the counters' lower bound."""
    ev = group["kv_events"]
    exact = ev["never_loaded_evicted_bytes"] + (ev["never_loaded_resident_bytes"] or 0)
    wasted = card.find("tr", data_figure="wasted_bytes").find_all("td")
    assert wasted[0].text == "Stored, never loaded back (exact, KV events)"
    assert exact > 0 and wasted[1].text == page_bytes(exact)


# -- the states -------------------------------------------------------------------------------
def test_keep(chromium, tmp_path):
    loaded, status = asyncio.run(_offline(chromium, tmp_path / "keep.png", "laptop-eviction"))
    (group,) = status["groups"]
    assert group["recommendation"]["action"] == "keep"
    assert not group["kv_events"]["provisional"]
    for page in loaded.both():
        card = groups(page)[group["labels"]["model_name"]]
        badge = badge_of(card)
        assert badge.text == "keep" and badge.attrs["data-state"] == "advice"
        assert "--kv-offloading-size" not in card.find("div", cls="verdict").text
        reasons = card.find("ul", cls="reasons").find_all("li")
        assert [r.text for r in reasons] == group["recommendation"]["reasons"] + (
            group["recommendation"]["warnings"] or []
        )
        _exact_never_loaded(card, group)
        trends_drawn(card, {"offload_hit_ratio", "gpu_prefix_hit_ratio", "mean_ttft_seconds"})
        assert set(advice_over_time(card)) == {"keep"}
        assert not page.find_all(id="provisional")
        assert card.find("svg", id="curve-chart").find("g", data_mark="current")
    badge = badge_of(groups(loaded.refreshed)[group["labels"]["model_name"]])
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, GREEN)


def test_enable(chromium, tmp_path):
    loaded, status = asyncio.run(
        _offline(chromium, tmp_path / "enable.png", "pressure-without-offloading")
    )
    (group,) = status["groups"]
    rec = group["recommendation"]
    assert rec["action"] == "enable" and rec["kv_offloading_size_gib"]
    for page in loaded.both():
        card = groups(page)[group["labels"]["model_name"]]
        assert badge_of(card).text == "enable"
        verdict = card.find("div", cls="verdict").text
        assert f"→ --kv-offloading-size {rec['kv_offloading_size_gib']:g}" in verdict
        assert "offloading off" in card.find("h2").text
        chart = card.find("svg", id="curve-chart")
        marks = {m.attrs["data-mark"] for m in chart.find_all("g") if "data-mark" in m.attrs}
        assert "advised" in marks and "current" not in marks  # no tier now: no current size
        trends_drawn(card, {"gpu_prefix_hit_ratio", "gpu_kv_usage_ratio"})
        assert set(advice_over_time(card)) == {"enable"}
    badge = badge_of(groups(loaded.refreshed)[group["labels"]["model_name"]])
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, AMBER)


def _cgroup(d: Path) -> Path:
    """vLLM's container as a cgroup v2 directory: 8 GiB held of a 16 GiB limit."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{10 * 2**30}\n")
    (d / "memory.max").write_text(f"{16 * 2**30}\n")
    (d / "memory.stat").write_text(f"anon {2 * 2**30}\nfile {8 * 2**30}\nshmem {6 * 2**30}\n")
    (d / "memory.events").write_text("oom 0\noom_kill 0\n")
    return d


async def _disable(chromium, shot: Path) -> Loaded:
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


def test_disable(chromium, tmp_path):
    loaded = asyncio.run(_disable(chromium, tmp_path / "disable.png"))
    for page in loaded.both():
        card = groups(page)[SIM_MODEL]
        badge = badge_of(card)
        assert badge.attrs["data-state"] == "advice" and badge.text == "disable"
        assert card.find("p", data_ttft="now").text.startswith("TTFT effect of the CPU tier now: +")
        tiles = trends_drawn(card, {"offload_hit_ratio", "mean_ttft_seconds", "ttft_effect"})
        # the TTFT effect with its range: a band behind the line, the range in its figure
        assert tiles["ttft_effect"].find("polygon", cls="band")
        assert re.fullmatch(
            r"\+[\d.]+ ms \([−+][\d.]+ ms … [−+][\d.]+ ms\)",
            tiles["ttft_effect"].find("span", cls="now").text,
        )
        assert advice_over_time(card)[-1] == "disable"
        # durations for people, and the targets' columns say what they hold
        meta = page.find("span", id="meta").text
        assert "scrape every 200 ms" in meta and not re.search(r"\d\.\d{4,}", meta), meta
        table = page.find("table", id="targets")
        assert [th.text for th in table.find_all("th")] == [
            "instance", "state", "last success", "scrape took", "error",
        ]  # fmt: skip
        row = table.find("tbody").find("tr").find_all("td")
        assert re.fullmatch(
            r"(just now|[\d.]+ (ms|s) ago)\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row[2].text
        ), row[2].text
        assert re.fullmatch(r"[\d.]+ (ms|s)", row[3].text), row[3].text
        # vLLM's container memory: 8 GiB unreclaimable (2 anon + 6 shared) of 16 GiB
        host = page.find("section", id="host-memory").text
        assert "unreclaimable 8.59 GB" in host and "limit 17.18 GB" in host
        assert "(50 % of it held)" in host
    badge = badge_of(groups(loaded.refreshed)[SIM_MODEL])
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, RED)


async def _target_down(chromium, shot: Path) -> Loaded:
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
    loaded = asyncio.run(_target_down(chromium, tmp_path / "target-down.png"))
    for page in loaded.both():
        card = groups(page)[SIM_MODEL]
        badge = badge_of(card)
        assert badge.text == "target down" and badge.attrs["data-state"] == "down"
        assert badge.classes() == {"action", "target-down"}
        assert card.find("span", cls="was").text == "last advice: disable"
        assert "STALE: target down" in card.text
        # the trends end in a gap, the last value shown as down; the advice trend ends down
        tiles = trends_drawn(card, {"offload_hit_ratio"})
        now = tiles["offload_hit_ratio"].find("span", cls="now").text
        assert re.fullmatch(r"\d+\.\d %, then down", now), now
        runs = advice_over_time(card)
        assert runs[-1] == "down" and "disable" in runs, runs
        rows = page.find("table", id="targets").find_all("tr")[1:]
        assert all(r.find_all("td")[1].text == "down" for r in rows)
        assert any("cannot connect" in r.text for r in rows)
    badge = badge_of(groups(loaded.refreshed)[SIM_MODEL])
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, RED)


def test_provisional_curve_marks_current_and_advised(chromium, tmp_path):
    # A RAG service whose CPU tier is the size of its GPU cache: the curve says grow, and the
    # stream is still warming up (first touches dominate), so the curve is provisional.
    loaded, status = asyncio.run(
        _offline(chromium, tmp_path / "provisional.png", "buffer-too-small", 300.0)
    )
    (group,) = status["groups"]
    rec, ev = group["recommendation"], group["kv_events"]
    assert rec["action"] == "grow" and rec["kv_offloading_size_gib"] and ev["provisional"]
    advised = rec["kv_offloading_size_gib"]
    current = group["figures"]["cpu_capacity_bytes"] / 2**30
    for page in loaded.both():
        card = groups(page)[group["labels"]["model_name"]]
        assert badge_of(card).text == "grow"
        warning = card.find("p", id="provisional").text
        assert warning == "provisional: " + "; ".join(ev["provisional_reasons"])
        chart = card.find("svg", id="curve-chart")
        assert chart.find("path", cls="curve").attrs["d"].count("L") >= 4
        marks = {m.attrs["data-mark"]: m for m in chart.find_all("g") if "data-mark" in m.attrs}
        assert set(marks) == {"current", "advised", "achievable"}
        assert float(marks["current"].attrs["data-gib"]) == pytest.approx(current)
        assert float(marks["advised"].attrs["data-gib"]) == advised
        assert marks["advised"].find("text").text.startswith(f"advised {advised:g} GiB · ")
        assert marks["current"].find("text").text.startswith("current 2 GiB · ")
        x = {k: float(m.find("line").attrs["x1"]) for k, m in marks.items() if k != "achievable"}
        assert x["current"] < x["advised"]  # the advised line right of the current one
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
        _exact_never_loaded(card, group)
        trends_drawn(card, {"offload_hit_ratio", "load_gbps"})


async def _no_data(chromium, shot: Path) -> Loaded:
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
    loaded = asyncio.run(_no_data(chromium, tmp_path / "no-data.png"))
    for page in loaded.both():
        card = groups(page)["Qwen/Qwen3-Reranker-0.6B"]
        badge = badge_of(card)
        assert badge.text == "waiting for data" and badge.attrs["data-state"] == "waiting"
        assert badge.classes() == {"action", "waiting"}
        assert not page.find_all(cls="keep")  # no green "keep" while it cannot judge
        assert "too little data to judge" in card.text
        assert "--kv-offloading-size" not in card.text
    badge = badge_of(groups(loaded.refreshed)["Qwen/Qwen3-Reranker-0.6B"])
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, BLUE)


async def _all_down(chromium, shot: Path) -> Loaded:
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
    loaded = asyncio.run(_all_down(chromium, tmp_path / "all-down.png"))
    for page in loaded.both():
        badge = badge_of(page.find("section", id="no-groups"))
        assert badge.text == "target down"
        assert not page.find_all("section", cls="group")
    badge = badge_of(loaded.refreshed.find("section", id="no-groups"))
    assert (badge.attrs["data-fg"], badge.attrs["data-bg"]) == (WHITE, RED)
