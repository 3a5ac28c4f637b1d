"""The window's fast path (`Window._count_fast`: a group whose counter series are those of its
previous scrape, all grown) gives what the one-series-at-a-time path gives, to the last bit:
generated scrape sequences with restarts, decreases, NaN and infinite values, `_created` moving,
series and models coming and going, fed to a window with the fast path and to one without."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import Extract

KEYS = ("prompt_tokens", "load_bytes", "ttft_count", "ttft_sum")
MODELS = ("a", "b")
ENGINES = ("0", "1")
SERIES = [(k, "i", m, e) for m in MODELS for e in ENGINES for k in KEYS]

# What happens to a series in a scrape: most scrapes only grow (the fast path's case); in the
# others one or two series do something else.
_EVENTS = ["same", "down", "zero", "nan", "inf", "missing", "created", "no_created", "back"]


@st.composite
def _scrapes(draw: st.DrawFn) -> list[Extract]:
    values = {s: draw(st.floats(1, 1e6)) for s in SERIES}
    created = dict.fromkeys(SERIES, 1.0e9)
    out = []
    t = 1.8e9
    for _ in range(draw(st.integers(2, 30))):
        t += draw(st.sampled_from([15.0, 15.0, 15.0, 30.0, 0.5]))
        ex = Extract(t)
        model_gone = draw(st.sampled_from([None] * 8 + list(MODELS)))
        odd = {}
        if draw(st.integers(0, 2)) == 0:
            for _ in range(draw(st.integers(1, 2))):
                odd[draw(st.sampled_from(SERIES))] = draw(st.sampled_from(_EVENTS))
        for s in SERIES:
            if s[2] == model_gone:
                continue
            event = odd.get(s, "grow")
            if event == "grow":
                values[s] += draw(st.sampled_from([1.0, 0.1, 1e-9, 123456.789, 3.0e15]))
            elif event == "down":
                values[s] *= draw(st.sampled_from([0.5, 1 - 1e-9]))
            elif event == "zero":
                values[s] = 0.0
            elif event == "created":
                created[s] += 60.0
            elif event == "no_created":
                created[s] = math.nan  # taken out below: a series without `_created`
            elif event == "back":
                created[s] = 1.0e9
            if event == "missing":
                continue
            value = {"nan": math.nan, "inf": math.inf}.get(event, values[s])
            ex.counters[s] = value
            if not math.isnan(created[s]):
                ex.created[s] = created[s]
        for m in MODELS:
            if m != model_gone:
                ex.gauges[("gpu_kv_usage", "i", m, "0")] = draw(st.floats(0, 1))
        ex.offload_families["i"] = True
        ex.models["i"] = {m for m in MODELS if m != model_gone}
        out.append(ex)
    return out


def _state(window: Window) -> str:
    out = []
    for g in window.groups():
        static = window.static(g)
        out.append(
            (
                g,
                window.delta(g),
                window.latest(g),
                static.lifetime,
                sorted(static.engines),
                window.anomalies(g),
                sorted(window.series(g).items()),
            )
        )
    return repr((out, window.resets))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scrapes(), st.sampled_from([None, 40.0]))
def test_the_fast_path_gives_the_slow_paths_figures(scrapes: list[Extract], seconds: float | None):
    fast, slow = Window(seconds), Window(seconds)
    slow._plan = lambda ex, values: None  # type: ignore[method-assign]
    for ex in scrapes:
        fast.update(ex)
        slow.update(ex)
        assert _state(fast) == _state(slow)


def test_steady_scrapes_take_the_fast_path() -> None:
    """The case it is for: every group of a steady target goes through the columns."""
    window = Window(None)
    for n in range(5):
        ex = Extract(1.8e9 + 15 * n)
        for s in SERIES:
            ex.counters[s] = 10.0 * n + len(s[0])
            ex.created[s] = 1.0e9
        window.update(ex)
        if n >= 1:
            assert set(window._columns) == {("i", "a"), ("i", "b")}
            assert not window._series
