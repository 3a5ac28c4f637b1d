"""Values that are finite numbers but outside what the metric can be (issue #25 item 4, the
input side): a KV-cache usage of 7 or −1 (a fraction), a negative count of requests waiting
for capacity, a negative counter. Before: one usage of 7 among 25 scrapes made
`gpu_kv_usage_ratio` 0.29 where the real run says 0.0 (−1: −0.042), and one waiting count of
−3 made `waiting_for_capacity` −0.125 and turned the TTFT effect of the CPU tier from −3.5 ms
into +35.6 ms; a counter at −5 was only "went down without a restart". Now each catalog row
has its range (`catalog.CATALOG`): a value outside it is unknown with a reason naming the
series and the value, the figures that read it are absent while that scrape is in the window
(then back), `analyze` prints the reason in one line and exits 0, and the sidecar's status
JSON carries it (`kvoffload_samples_rejected_total{reason="range"}` counts it). Every body
here is a real vLLM 0.26 scrape from an H200 with one value pushed out of range."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kvoffload.analysis.analyze import analyze_window, window_from_expositions
from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.ingest.catalog import CATALOG, COUNT, FRACTION, WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.recording.openmetrics import Recording, read_recording
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig

from helpers import h200_scrapes, recording_text, running

SCRAPES = h200_scrapes("8b-offload")  # 25 settled scrapes of a real run
BAD_AT = 12  # the scrape whose value is pushed out of range
MODEL = 'model_name="qwen3-8b-dummy"'
USAGE = f'vllm:kv_cache_usage_perc{{engine="0",{MODEL}}}'
WAITING = f'vllm:num_requests_waiting_by_reason{{engine="0",{MODEL},reason="capacity"}}'
PROMPT = f'vllm:prompt_tokens_total{{engine="0",{MODEL}}}'

# (series, value pushed in, the figure that reads it, the row, its range)
CASES = {
    "usage-7": (USAGE, "7", "gpu_kv_usage_ratio", "gauge gpu_kv_usage", "[0, 1]"),
    "usage-minus-1": (USAGE, "-1", "gpu_kv_usage_ratio", "gauge gpu_kv_usage", "[0, 1]"),
    "waiting-negative": (
        WAITING, "-3", "waiting_for_capacity", "gauge waiting_capacity", "[0, 1e+30]"
    ),
    "counter-negative": (
        PROMPT, "-5", "prompt_tokens_per_second", "counter prompt_tokens", "[0, 1e+30]"
    ),
}  # fmt: skip


def _reads(key: str) -> set[str]:
    """The vLLM series a figure's formula reads (its description names each in backticks)."""
    figure = FIGURES_BY_KEY.get(key)
    return set(re.findall(r"`([^`]+)`", figure.formula.describe())) if figure else set()


def why(case: str) -> str:
    """The warning's start: the row, the series and its value, the range."""
    series, value, _figure, row, within = CASES[case]
    return f"{row} unknown ({series} = {value}, outside {within})"


def pushed(body: str, series: str, value: str) -> str:
    """The body with the one sample of `series` set to `value`."""
    out, n = re.subn(rf"^{re.escape(series)} \S+$", f"{series} {value}", body, flags=re.M)
    assert n == 1, (series, n)
    return out


def _scrapes(case: str | None) -> list[tuple[float, str]]:
    if case is None:
        return SCRAPES
    series, value = CASES[case][:2]
    return [(t, pushed(b, series, value) if i == BAD_AT else b) for i, (t, b) in enumerate(SCRAPES)]


def _write(path: Path, case: str | None, layout: str) -> Path:
    """A recording of the real run: the journal layout `record` appends while it runs, or the
    strict OpenMetrics it leaves when it ends (read by the general reader and the strict one)."""
    scrapes = _scrapes(case)
    if layout == "journal":
        path.write_text(recording_text(list(scrapes)))
        return path
    rec = Recording(str(path), instance="vllm:8000")
    for t, body in scrapes:
        rec.write_exposition(parse_text(body), t)
    rec.close()
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvoffload", "analyze", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _no_constants(name: str) -> float:
    raise AssertionError(f"{name} in the JSON")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real run's analysis, nothing pushed: the figures the cases take away."""
    path = _write(tmp_path_factory.mktemp("clean") / "clean.om", None, "strict")
    r = _analyze(str(path), "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)["groups"]
    return group


def test_every_catalog_row_has_one_shape_and_a_range() -> None:
    kinds = {"counter", "offload", "gauge", "label"}
    for src in CATALOG:
        assert src.kind in kinds, src
        assert src.range.low <= src.range.high, src
        if src.kind in ("counter", "offload"):
            assert src.range == COUNT, src  # a counter is never negative
    rows = {src.key: src for src in CATALOG if src.kind == "gauge"}
    assert rows["gpu_kv_usage"].range == FRACTION
    assert rows["waiting_capacity"].range.low == 0.0 and rows["running"].range.low == 0.0
    # each (key, naming) once: the flat and the legacy offload rows, every other key once
    keys = [(src.key, src.naming) for src in CATALOG]
    assert len(keys) == len(set(keys))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["journal", "strict"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_value_out_of_range_in_a_recording_is_unknown_with_its_reason(
    tmp_path: Path, clean: dict[str, Any], case: str, layout: str
) -> None:
    figure, reason = CASES[case][2], why(case)
    assert clean["figures"][figure] is not None  # the real run has it
    path = _write(tmp_path / f"{case}.om", case, layout)
    r = _analyze(str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    (group,) = json.loads(r.stdout, parse_constant=_no_constants)["groups"]
    assert group["figures"][figure] is None
    assert any(w.startswith(reason) for w in group["recommendation"]["warnings"])
    # The rest of the figures stand as the real run has them (those reading the same series,
    # e.g. the reload wait from the capacity queue, are absent with it).
    others = {
        k: v
        for k, v in clean["figures"].items()
        if k != figure and "ttft" not in k and v and not _reads(k) & _reads(figure)
    }
    if case != "counter-negative":  # (a counter feeds many figures; a gauge only its own)
        assert {k: group["figures"][k] for k in others} == pytest.approx(others)
    if case == "waiting-negative":  # the TTFT model reads it: no effect judged without it
        assert clean["figures"]["offload_ttft_effect_seconds"] is not None
        assert group["figures"]["offload_ttft_effect_seconds"] is None
    # The text report says it in one line.
    text = _analyze(str(path))
    assert text.returncode == 0, text.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if reason in ln]
    assert line.strip().startswith("! ")


@pytest.mark.parametrize("case", list(CASES))
def test_every_reader_of_a_recording_says_the_same(tmp_path: Path, case: str) -> None:
    """The general reader (each scrape through catalog.extract) and the fast one (a scrape
    shape's fill, or catalog.extract where a value is outside its range) agree."""
    path = _write(tmp_path / f"{case}.om", case, "journal")
    win, _n, lifetime = window_from_expositions(read_recording(str(path), wanted, WANTED_FAMILIES))
    general = analyze_window(win, lifetime=lifetime)
    fast = _analyze(str(path), "--json")
    assert json.loads(fast.stdout)["groups"] == json.loads(json.dumps(general))


# -- a live sidecar scraping a real body with one value out of range ----------------------------
async def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def _group(sidecar: Sidecar) -> dict[str, Any] | None:
    groups = json.loads(json.dumps(sidecar.status(), allow_nan=False))["groups"]
    return groups[0] if groups else None


async def _live(case: str) -> dict[str, Any]:
    """A target serving the real run's scrapes in turn (the last again once they are spent),
    scrape BAD_AT pushed out of range: the status while it is in the 1 s window, once it has
    left, and /metrics meanwhile."""
    bodies = [b for _t, b in _scrapes(case)]
    served = {"n": 0}

    async def metrics(_r: web.Request) -> web.Response:
        served["n"] += 1
        return web.Response(text=bodies[min(served["n"] - 1, len(bodies) - 1)])

    reason = why(case)
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with running(app) as port:
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://127.0.0.1:{port}/metrics"], interval_seconds=0.1, window_seconds=1.0
            )
        )
        async with running(make_app(sidecar)) as sport, aiohttp.ClientSession() as s:
            await _until(lambda: served["n"] > BAD_AT + 1, 30, "the scrape after the bad one")
            during = _group(sidecar)
            async with s.get(f"http://127.0.0.1:{sport}/api/v1/status") as r:
                assert r.status == 200
                status = json.loads(await r.text(), parse_constant=_no_constants)
            async with s.get(f"http://127.0.0.1:{sport}/metrics") as r:
                assert r.status == 200
                exposed = await r.text()
            after = await _until(
                lambda: (
                    (g := _group(sidecar))
                    and served["n"] > BAD_AT + 15
                    and not any(reason in w for w in g["recommendation"]["warnings"])
                    and g
                ),
                30,
                "the bad scrape out of the window",
            )
    return {"during": during, "status": status, "metrics": exposed, "after": after}


@pytest.mark.parametrize("case", ["usage-7", "waiting-negative", "counter-negative"])
def test_a_live_target_with_a_value_out_of_range_says_why_and_recovers(case: str) -> None:
    figure, reason = CASES[case][2], why(case)
    out = asyncio.run(_live(case))
    during, after = out["during"], out["after"]
    assert during is not None and during["figures"][figure] is None
    assert any(w.startswith(reason) for w in during["recommendation"]["warnings"])
    (group,) = out["status"]["groups"]
    assert any(w.startswith(reason) for w in group["recommendation"]["warnings"])
    # Counted once as a sample out of range (the NaN/±Inf kind stays reason="value").
    assert out["status"]["targets"][0]["samples_rejected"] == {"range": 1}
    assert re.search(
        r'^kvoffload_samples_rejected_total\{reason="range",target="[^"]+"\} 1\.0$',
        out["metrics"],
        re.M,
    )
    # Never the value: no 7 averaged into a ratio, no -3 requests, nothing NaN.
    assert not re.search(r"^[^#].* (NaN|[+-]Inf)$", out["metrics"], re.M)
    if figure == "gpu_kv_usage_ratio":
        assert "kvoffload_gpu_kv_usage_ratio{" not in out["metrics"]
    # Once the scrape has left the window, the figure is back and believable.
    value = after["figures"][figure]
    assert value is not None and value >= 0.0
    if figure == "gpu_kv_usage_ratio":
        assert value <= 1.0


@pytest.mark.parametrize(
    ("label", "figure"),
    [("kv_offloading_size", "cpu_capacity_bytes"), ("kv_cache_size_tokens", "gpu_capacity_tokens")],
)
def test_a_config_label_out_of_range_is_as_if_absent(
    tmp_path: Path, clean: dict[str, Any], label: str, figure: str
) -> None:
    """A numeric label of vllm:cache_config_info below its row's range (a negative size): no
    figure from it, or the one from the labels that remain (gpu_capacity_tokens: blocks ×
    block size), never a negative capacity."""
    path = tmp_path / "labels.om"
    scrapes = [(t, re.sub(rf'{label}="', f'{label}="-', b)) for t, b in SCRAPES]
    path.write_text(recording_text(scrapes))
    r = _analyze(str(path), "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout, parse_constant=_no_constants)["groups"]
    assert clean["figures"][figure] > 0
    value = group["figures"][figure]
    assert value is None or value == clean["figures"][figure]
