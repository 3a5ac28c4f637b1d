"""The sidecar's own /metrics writer (kvoffload.sidecar.exposition) against prometheus_client's:
the same families give the same bytes, text 0.0.4 and OpenMetrics, for the sidecar's real
families (a fleet of targets from the real H200 capture, one of them down) and for the odd
ones it hands back to prometheus_client (other types, exemplars, timestamps, names that need
escaping). Each family list is collected once and written both ways, so values that move
(the process' CPU time) are the same on both sides."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Exemplar, Sample

from kvoffload.analysis.analyze import analyze_groups
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.sidecar.exposition import write_openmetrics, write_text
from kvoffload.sidecar.metrics import SidecarCollector
from kvoffload.sidecar.service import EventFigures, SidecarView, TargetState

from helpers import h200_scrapes


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def _same_both_ways(metrics: list[Metric]) -> None:
    assert write_text(metrics) == generate_latest(_Fixed(metrics))  # type: ignore[arg-type]
    assert write_openmetrics(metrics) == generate_openmetrics(_Fixed(metrics))


def _sidecar_view() -> SidecarView:
    """Six targets of the real H200 capture (offloading on and off), one down, with KV-event
    counts for two of them."""
    window = Window(300.0)
    targets = []
    for i in range(6):
        name = f"10.0.0.{i}:8000"
        server = "8b-offload" if i % 2 else "8b-nooffload"
        for ts, body in h200_scrapes(server)[:8]:
            window.update(extract(parse_text(body, wanted, WANTED_FAMILIES), ts + i, name))
        target = TargetState(f"http://{name}/metrics", name, up=i != 3, scrapes=8)
        target.last_duration_seconds = 0.0123 * (i + 1)
        target.last_success_timestamp = 1.8e9 + i
        target.payload_bytes = 65245
        target.rejected = {"value": 2} if i == 1 else {}
        targets.append(target)
    groups = analyze_groups(window)
    for g in groups:
        g.stale = g.instance == targets[3].name
    events = {
        targets[0].name: EventFigures(1, 1200, 3, 0, 1.0),
        targets[1].name: EventFigures(0, 7, 0, 12, 0.01),
    }
    return SidecarView(targets, events, groups, [], 300.0, 5.0, True)


def test_the_sidecars_families_are_written_as_prometheus_client_writes_them():
    view = _sidecar_view()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(view))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    metrics = list(registry.collect())
    assert sum(len(m.samples) for m in metrics) > 150
    _same_both_ways(metrics)


def test_odd_values_labels_and_help_are_escaped_alike():
    gauge = GaugeMetricFamily(
        "kvoffload_odd", 'help with \\ backslash, "quotes"\nand a newline', labels=["a", "b"]
    )
    for i, value in enumerate(
        [0.0, -0.0, 1.0, 1, 1e21, 123456789.0, 1.5e-7, math.inf, -math.inf, math.nan, 2**53]
    ):
        gauge.add_metric([f"v{i}", 'q"\\\n ü ✓ {}'], value)
    gauge.add_metric(["", ""], 3.25)
    counter = CounterMetricFamily("kvoffload_things", "Things.", labels=["target"])
    counter.add_metric(["t"], 5, created=1.8e9)
    counter.add_metric(["u"], 7)
    histogram = HistogramMetricFamily("kvoffload_sizes", "Sizes.", labels=["target"])
    histogram.add_metric(["t"], [("1.0", 1), ("+Inf", 3)], 12.5)
    histogram.add_metric(["u"], [("0.5", 0), ("+Inf", 0)], 0.0, timestamp=None)
    empty = GaugeMetricFamily("kvoffload_empty", "No samples.", labels=["target"])
    unlabelled = GaugeMetricFamily("kvoffload_unlabelled", "One value.", value=4.0)
    with_unit = GaugeMetricFamily("kvoffload_size_bytes", "Bytes.", value=1.0, unit="bytes")
    _same_both_ways([gauge, counter, histogram, empty, unlabelled, with_unit])


def test_families_it_does_not_cover_are_handed_to_prometheus_client():
    info = InfoMetricFamily("kvoffload_build", "Build.", value={"version": "1"})
    stateset = StateSetMetricFamily("kvoffload_state", "State.", value={"a": True, "b": False})
    summary = SummaryMetricFamily("kvoffload_latency", "Latency.", count_value=3, sum_value=1.5)
    unknown = UnknownMetricFamily("kvoffload_unknown", "Unknown.", value=1.0)
    gauge_histogram = GaugeHistogramMetricFamily(
        "kvoffload_gh", "Gauge histogram.", buckets=[("+Inf", 2)], gsum_value=3.0
    )
    stamped = GaugeMetricFamily("kvoffload_stamped", "Stamped.", labels=["a"])
    stamped.add_metric(["x"], 1.0, timestamp=1.8e9)
    colon = GaugeMetricFamily("kvoffload:colon", "A recording-rule style name.", value=2.0)
    exemplar = CounterMetricFamily("kvoffload_ex", "Exemplar.", labels=["a"])
    exemplar.samples.append(
        Sample("kvoffload_ex_total", {"a": "x"}, 1.0, None, Exemplar({"trace": "t"}, 0.5))
    )
    bad_label = GaugeMetricFamily("kvoffload_bad_label", "Label name needs escaping.")
    bad_label.samples.append(Sample("kvoffload_bad_label", {"a.b": "x"}, 1.0))
    _same_both_ways(
        [info, stateset, summary, unknown, gauge_histogram, stamped, colon, exemplar, bad_label]
    )


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("openmetrics", [False, True])
def test_a_thousand_groups_written_fast(openmetrics):
    """The point of the writer: the same bytes in a fraction of prometheus_client's time."""
    import time

    view = _sidecar_view()
    groups = []
    for i in range(170):  # ~1,000 groups
        for g in view.groups():
            copy = type(g)(**{**g.__dict__, "instance": f"{g.instance}-{i}", "stale": False})
            groups.append(copy)
    big = SidecarView(view.targets, {}, groups, [], 300.0, 5.0, True)
    metrics = list(SidecarCollector(big).collect())
    write = write_openmetrics if openmetrics else write_text
    reference = generate_openmetrics if openmetrics else generate_latest
    ours, theirs = [], []
    for _ in range(5):
        start = time.process_time()
        body = write(metrics)
        ours.append(time.process_time() - start)
        start = time.process_time()
        expected = reference(_Fixed(metrics))  # type: ignore[arg-type]
        theirs.append(time.process_time() - start)
    assert body == expected
    # 2x (text) and 4x (OpenMetrics) measured; loose, for a busy machine.
    assert min(theirs) / min(ours) > 1.2
