"""Run a simulator scenario with KV events: the window of scrapes and the event state, as the
sidecar would have them, every batch through vLLM's wire encoding."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence

from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.kvevents.decode import decode_batch
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import cancel_all
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.config import Scenario
from kvoffload.sim.kv_events import ZmqEventPublisher, encode_batch

INSTANCE = "sim:8000"


# Runs already made in this process, by (scenario, sample rates, interval): the simulator is
# seeded, so a run is the same each time; callers get a copy each (they may change it). The
# last 32 only (5-12 MB each: every scenario once, a few hundred MB at most).
_RUNS: OrderedDict[str, tuple[Window, list[TargetEvents], dict]] = OrderedDict()
_KEPT_RUNS = 32


def run_with_event_states(
    scenario: str | Scenario, sample_rates: Sequence[float], interval: float | None = None
) -> tuple[Window, list[TargetEvents], dict]:
    """One run, its decoded events fed to one TargetEvents per sample rate (so exact and
    sampled modes see the very same stream), scraped as often as the scenario says (the TTFT
    verdict fits costs over scrape intervals: 15 s, or 1 s for the short real-H200 sets).

    Made once a test process: several files ask for the same runs (3-5 s each here)."""
    sc = scenarios.get(scenario) if isinstance(scenario, str) else scenario
    interval = interval or sc.scrape_interval_s
    key = repr((sc, tuple(sample_rates), interval))
    if key not in _RUNS:
        _RUNS[key] = _run(sc, sample_rates, interval)
        while len(_RUNS) > _KEPT_RUNS:
            _RUNS.popitem(last=False)
    _RUNS.move_to_end(key)
    return copy.deepcopy(_RUNS[key])


def _run(
    sc: Scenario, sample_rates: Sequence[float], interval: float
) -> tuple[Window, list[TargetEvents], dict]:
    sim = SimServer(sc, kv_events=True)
    states = [TargetEvents(rate) for rate in sample_rates]
    window = Window(None)
    seqs: dict[int, int] = {}
    t = 0.0
    while True:
        sim.advance_to(t)
        for rank, ts, events in sim.drain_kv_events():
            seq = seqs.get(rank, 0)
            seqs[rank] = seq + 1
            batch = decode_batch(encode_batch(ts, events, rank))
            for state in states:
                state.ingest(batch, seq, rank)
        window.update(
            extract(parse_text(sim.render(), wanted, WANTED_FAMILIES), sc.start_epoch + t, INSTANCE)
        )
        if t > sc.duration_s:
            break
        t += interval
    return window, states, sim.ground_truth(include_requests=False)


def run_with_events(
    scenario: str | Scenario, sample_rate: float = 1.0, interval: float | None = None
) -> tuple[Window, TargetEvents, dict]:
    window, (state,), truth = run_with_event_states(scenario, [sample_rate], interval)
    return window, state, truth


@contextlib.asynccontextmanager
async def replays_served(pub: ZmqEventPublisher, every: float = 0.005) -> AsyncIterator[None]:
    """Answer the publisher's replay requests in the background (vLLM's replay thread), for
    the duration of the block; the publisher is closed at the end."""

    async def serve() -> None:
        while True:
            pub.service_replay()
            await asyncio.sleep(every)

    task = asyncio.create_task(serve())
    try:
        yield
    finally:
        await cancel_all([task])
        pub.close()
