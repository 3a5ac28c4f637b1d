"""The sidecar's /metrics body, written off the event loop and fast.

`render` writes prometheus_client's `generate_latest` bytes without its per-sample checks.
Those took seconds a request at a thousand targets (docs/performance.md)."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest as _text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as _om_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kvoffload.sidecar.metrics import build_registry
from kvoffload.sidecar.service import Service

# What prometheus_client leaves as it is: a legacy metric name (HELP/TYPE lines, text
# samples), a sample name OpenMetrics does not rewrite (no ':'), a legacy label name.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_OM_SAMPLE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TYPES = frozenset({"counter", "gauge", "histogram"})
# Text format: samples of these suffixes go to a gauge family of their own at the end.
_TEXT_APART = ("_created", "_gsum", "_gcount")
_EOF = "# EOF\n"


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


# A family this writer does not cover exactly (other types, exemplars, timestamps, names
# needing escapes) goes to prometheus_client as it is; tests/test_exposition.py holds the two
# to the same bytes.
def _covered(metric: Metric, openmetrics: bool) -> bool:
    if metric.type not in _TYPES or not _METRIC_NAME.fullmatch(metric.name):
        return False
    if metric.unit and not openmetrics:
        return False
    sample_name = _OM_SAMPLE_NAME if openmetrics else _METRIC_NAME
    names: set[str] = set()
    keys: set[tuple[str, ...]] = set()
    for s in metric.samples:
        if s.exemplar is not None or s.timestamp is not None or s.native_histogram is not None:
            return False
        if s.value is None:
            return False
        names.add(s.name)
        keys.add(tuple(s.labels))
    return all(sample_name.fullmatch(n) for n in names) and all(
        _LABEL_NAME.fullmatch(k) for ks in keys for k in ks
    )


def _escaped(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Writer:
    """Sample lines, with what repeats across families made once per body.

    A group's label set (`model_name="…",target="…"`) comes back in every family, and so do
    values."""

    def __init__(self) -> None:
        self.label_sets: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        self.values: dict[float, str] = {}

    def label_set(self, labels: dict[str, str]) -> str:
        key = (tuple(labels), tuple(labels.values()))
        text = self.label_sets.get(key)
        if text is None:
            text = self.label_sets[key] = ",".join(
                [f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items())]
            )
        return text

    def value(self, value: float) -> str:
        if not value:  # 0.0 and -0.0 are one key but two strings
            return floatToGoString(value)
        text = self.values.get(value)
        if text is None:
            text = self.values[value] = floatToGoString(value)
        return text

    def lines(self, metric: Metric, out: list[str], apart: dict[str, list[str]] | None) -> None:
        """The sample lines of a covered family.

        With `apart` (text format), the `_created`, `_gsum` and `_gcount` samples go there by
        suffix."""
        own = {metric.name + sfx: sfx for sfx in _TEXT_APART} if apart is not None else {}
        label_sets, values = self.label_sets, self.values
        append = out.append
        for name, labels, v, *_rest in metric.samples:
            # What label_set() and value() do, inlined: this runs for every sample.
            key = (tuple(labels), tuple(labels.values()))
            text = label_sets.get(key)
            if text is None:
                text = self.label_set(labels)
            number = values.get(v) if v else None
            if number is None:
                number = self.value(v)
            line = f"{name}{{{text}}} {number}\n" if labels else f"{name} {number}\n"
            if own and name in own and apart is not None:
                apart.setdefault(own[name], []).append(line)
            else:
                append(line)


def write_text(metrics: Iterable[Metric]) -> bytes:
    """What prometheus_client's `generate_latest` writes for these families (text 0.0.4)."""
    out: list[str] = []
    writer = _Writer()
    for metric in metrics:
        if not _covered(metric, openmetrics=False):
            out.append(_text_latest(_One(metric)).decode("utf-8"))
            continue
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        apart: dict[str, list[str]] = {}
        writer.lines(metric, out, apart)
        for suffix, lines in sorted(apart.items()):
            out.append(f"# HELP {metric.name}{suffix} {doc}\n# TYPE {metric.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


def write_openmetrics(metrics: Iterable[Metric]) -> bytes:
    """What prometheus_client's OpenMetrics `generate_latest` writes for these families."""
    out: list[str] = []
    writer = _Writer()
    for metric in metrics:
        if not _covered(metric, openmetrics=True):
            body = _om_latest(_One(metric)).decode("utf-8")
            out.append(body.removesuffix(_EOF))
            continue
        name = metric.name
        doc = _escaped(metric.documentation)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n")
        if metric.unit:
            out.append(f"# UNIT {name} {metric.unit}\n")
        writer.lines(metric, out, None)
    out.append(_EOF)
    return "".join(out).encode("utf-8")


def render(registry: Collector, openmetrics: bool) -> bytes:
    metrics = registry.collect()
    return write_openmetrics(metrics) if openmetrics else write_text(metrics)


def render_metrics(service: Service, openmetrics: bool) -> bytes:
    """The /metrics body of `service` (a snapshot, when called off the event loop)."""
    with rendering():
        return render(build_registry(service), openmetrics)


_lock = threading.Lock()
_writers = 0  # bodies being written off the loop now
_collecting = False  # whether the collector was on when the first of them began
_interval = 0.005  # the switch interval then
# While a body is written in a thread, the thread holding the GIL gives it up when the event
# loop has waited this long for it (Python's default: 5 ms). The loop takes and gives back the
# GIL around every socket call, so at 5 ms each scrape landing meanwhile waited tens of ms and
# the loop fell 100-200 ms behind (measured on a quiet 16-core machine); at 0.5 ms, ~20 ms.
SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def rendering() -> Iterator[None]:
    """While a body (/metrics, the status JSON) is written in a worker thread: no cyclic GC, short
    switch interval.

    Both keep the event loop answering while tens of thousands of samples are written."""
    # The samples stay alive until written: collections would move them to the oldest generation
    # and set off a full collection that holds every thread. They hold no cycles, so reference
    # counting frees them. SWITCH_INTERVAL says why it is short.
    global _writers, _collecting, _interval
    with _lock:
        if _writers == 0:
            _collecting = gc.isenabled()
            _interval = sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(min(_interval, SWITCH_INTERVAL))
        _writers += 1
    try:
        yield
    finally:
        with _lock:
            _writers -= 1
            if _writers == 0:
                sys.setswitchinterval(_interval)
                if _collecting:
                    gc.enable()
