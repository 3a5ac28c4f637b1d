"""The TTFT model's parts that are closed formulas of rates, as recording rules, on a real vLLM
0.26 recording: each rule, evaluated by a real Prometheus, equals the sidecar's figure, and the
figure equals the part the TTFT verdict computes for itself (analysis.ttft.observe).

The recording is F-cpu4 (Qwen3-8B, multi-turn chat, 12 clients, a 4 GiB CPU tier, H200; from
../shared/reference/vllm-0.26-h200-ttft-2/F.tar.xz), backfilled with promtool. Its queue time is
mostly capacity queueing (66 ms = 56 ms waiting for KV capacity + 10 ms reload wait over the
whole run): the case where counting all queue time as the tier's wait was wrong (issue #24).

The window starts at a scrape where every series already exists (vLLM creates the load series
on the first load: PromQL's rate cannot count a series' first increase from 0, the sidecar
can) and ends at the last, so neither side extrapolates: a counter ratio agrees to float
rounding of the timestamps (Prometheus keeps milliseconds). The rules are evaluated as their
expressions at that instant, the offload gate's record replaced by its own rule's expression.
"""

from __future__ import annotations

import lzma
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from kvoffload.analysis import ttft
from kvoffload.analysis.analyze import window_from_recording
from kvoffload.analysis.context import Context
from kvoffload.analysis.formula import GATE_RECORD
from kvoffload.analysis.signals import compute_figures
from kvoffload.mixin import rules
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.renderings import record_name

from fleet_prom import backfill, prometheus_on

RECORDING = Path(__file__).parents[1] / "fixtures" / "vllm-0.26-h200-ttft" / "F" / "F-cpu4.om.xz"
INSTANCE = "127.0.0.1:F-cpu4"
MODEL = "qwen3-8b-dummy"
# Scrapes skipped at the start: the first load (and with it the load series) comes ~5 s in.
FIRST_SCRAPE = 12
QUEUE_PARTS = ("mean_queue_seconds", "capacity_queue_seconds", "reload_wait_seconds")
PARTS = (
    *QUEUE_PARTS,
    "mean_prefill_seconds",
    "requests_in_system",
    "reloaded_tokens_per_request",
    "loads_per_request",
    "load_copy_seconds",
)
# The two sides differ by the timestamps' rounding to milliseconds only.
TOLERANCE = 1e-4
CAPACITY_GAUGE = re.compile(
    r'^vllm:num_requests_waiting_by_reason\{[^}]*reason="capacity"[^}]*\} (\S+) (\S+)$', re.M
)


def _stamps(text: str) -> list[float]:
    stamps = {
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and line[0] != "#"
    }
    return sorted(stamps)


def _inline_gate(expr: str, gate: str) -> str:
    """A rule's expression with the offload gate's record replaced by the gate's own
    expression: a Prometheus that only holds the recording has not recorded it."""
    return expr.replace(GATE_RECORD, f"(\n{gate}\n)")


@dataclass
class Side:
    """One window's rules (as Prometheus evaluates them) and the sidecar's figures."""

    rules: dict[str, float]
    figures: dict[str, float | None]
    expected: dict[str, float | None]  # the figures with the gauge averaged as Prometheus does
    observed: ttft.Observed


def _side(path: Path, text: str, url: str, first: int, keys: tuple[str, ...]) -> Side:
    """The window from scrape `first` to the last, on both sides."""
    stamps = _stamps(text)
    # Prometheus keeps whole milliseconds, truncated (promtool reads `ts * 1000` as an int).
    start_ms, end_ms = math.floor(stamps[first] * 1000), math.floor(stamps[-1] * 1000)
    cfg = MixinConfig(rate_window=f"{end_ms - start_ms}ms", slow_window="1h")
    # A window a little shorter than the span keeps scrape `first` as its start (the whole
    # recording: no window).
    seconds = stamps[-1] - stamps[first] - 1e-4 if first else None
    window, _n, _lifetime = window_from_recording(str(path), seconds)
    group = (INSTANCE, MODEL)
    delta = window.delta(group)
    assert delta is not None
    # The rule's range is the sidecar's window to the millisecond: neither side extrapolates.
    assert abs(delta.seconds - (end_ms - start_ms) / 1000) < 1e-3, delta.seconds
    ctx = Context(delta, window.static(group))
    figures = compute_figures(ctx)
    observed = ttft.observe(ctx, figures["kv_bytes_per_token"])
    assert observed is not None

    exprs = {str(r["record"]): str(r["expr"]) for r in rules.recording_rules(cfg)}
    got: dict[str, float] = {}
    for key in keys:
        expr = _inline_gate(exprs[record_name(key, cfg)], exprs[GATE_RECORD])
        r = requests.get(
            f"{url}/api/v1/query",
            params={"query": expr, "time": f"{end_ms / 1000:.3f}"},
            timeout=30,
        )
        body = r.json()
        assert body["status"] == "success", (key, body)
        values = [
            float(s["value"][1])
            for s in body["data"]["result"]
            if s["metric"].get("instance") == INSTANCE and s["metric"].get("model_name") == MODEL
        ]
        assert len(values) == 1, (key, values)
        got[key] = values[0]

    # A gauge's mean over the window: Prometheus averages its n samples, the sidecar the n − 1
    # after the first (its intervals end there).
    gauge = {float(ts): float(v) for v, ts in CAPACITY_GAUGE.findall(text)}
    n = len(stamps) - first
    mean = figures["waiting_for_capacity"]
    assert mean is not None and mean > 0
    as_prometheus = ((n - 1) * mean + gauge[stamps[first]]) / n
    expected = dict(figures)
    capacity, queue = figures["capacity_queue_seconds"], figures["mean_queue_seconds"]
    assert capacity is not None and queue is not None
    expected["capacity_queue_seconds"] = capacity * as_prometheus / mean
    expected["reload_wait_seconds"] = max(queue - capacity * as_prometheus / mean, 0.0)
    return Side(got, figures, expected, observed)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Side]]:
    work = tmp_path_factory.mktemp("ttft-parts")
    path = work / "F-cpu4.om"
    text = lzma.decompress(RECORDING.read_bytes()).decode()
    path.write_text(text)
    tsdb = work / "tsdb"
    backfill(path, tsdb)
    with prometheus_on(tsdb) as url:
        yield {
            "late": _side(path, text, url, FIRST_SCRAPE, PARTS),
            # The queue's parts read series that exist from the first scrape: the whole run.
            "whole": _side(path, text, url, 0, QUEUE_PARTS),
        }


@pytest.mark.parametrize("which", ["late", "whole"])
def test_every_part_is_a_rule_that_equals_the_sidecar_figure(
    sides: dict[str, Side], which: str
) -> None:
    side = sides[which]
    for key, got in side.rules.items():
        want = side.expected[key]
        assert want is not None and want > 0, (key, want)
        assert math.isclose(got, want, rel_tol=TOLERANCE), (key, got, want)
    # The gauge's first sample moves its mean by under 1%: close to the sidecar's own figure.
    for key in ("capacity_queue_seconds", "reload_wait_seconds"):
        assert math.isclose(side.rules[key], side.figures[key] or 0.0, rel_tol=0.05), key


@pytest.mark.parametrize("which", ["late", "whole"])
def test_the_figures_are_the_verdicts_own_parts(sides: dict[str, Side], which: str) -> None:
    """One definition: what the rules and the sidecar publish is what the TTFT verdict reads
    (analysis.ttft.Observed), computed there by its own code."""
    f, o = sides[which].figures, sides[which].observed
    pairs = {
        "mean_queue_seconds": o.mean_queue,
        "mean_prefill_seconds": o.mean_prefill,
        "capacity_queue_seconds": o.capacity_queue,
        "reload_wait_seconds": max(o.mean_queue - o.capacity_queue, 0.0),
        "requests_in_system": o.in_system,
        "reloaded_tokens_per_request": o.loaded_tokens,
        "loads_per_request": o.loads,
        "load_copy_seconds": o.load_seconds_per_job,
    }
    for key, part in pairs.items():
        assert math.isclose(f[key] or 0.0, part or 0.0, rel_tol=1e-9), (key, f[key], part)


def test_queue_time_splits_into_capacity_queueing_and_reload_wait(
    sides: dict[str, Side],
) -> None:
    """The 8B chat case of issue #24 over the whole run: most of the queue (66.3 ms) is
    waiting for KV capacity (56.3 ms), which a server without a tier has too; the tier's wait
    is the rest (10.0 ms). The rules say the same, their capacity mean taking in the idle
    scrape before the run too (55.8 + 10.4 ms)."""
    ms = {k: round((v or 0.0) * 1000, 1) for k, v in sides["whole"].figures.items()}
    assert (ms["mean_queue_seconds"], ms["capacity_queue_seconds"]) == (66.3, 56.3)
    assert ms["reload_wait_seconds"] == 10.0
    whole = sides["whole"].rules
    queue = whole["mean_queue_seconds"]
    capacity = whole["capacity_queue_seconds"]
    reload = whole["reload_wait_seconds"]
    assert math.isclose(queue, capacity + reload, rel_tol=1e-9)
    assert (round(queue * 1000, 1), round(capacity * 1000, 1)) == (66.3, 55.8)
    assert round(reload * 1000, 1) == 10.4
    late = sides["late"].rules
    # A reload waits longer than its copy (2–10× on these runs).
    assert late["load_copy_seconds"] < late["reload_wait_seconds"] / late["loads_per_request"]
    assert late["requests_in_system"] > 1.0  # under load: others keep the engine stepping


def test_the_advisor_doc_names_each_parts_rule_and_what_cannot_be_one() -> None:
    """docs/advisor.md, "What Prometheus alone shows": every part's rule by its name (at the
    default windows), and the parts that are not formulas of rates."""
    doc = (Path(__file__).parents[2] / "docs" / "advisor.md").read_text()
    section = doc.split("## What Prometheus alone shows", 1)[1].split("\n## ", 1)[0]
    for key in PARTS:
        assert f"`{record_name(key, MixinConfig())}`" in section, key
    for words in ("t-statistic", "twin prediction", "Ranges from noise", "KV-event what-ifs"):
        assert words in section, words
