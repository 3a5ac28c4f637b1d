"""The scale bench's sidecar: what `kvoffload serve` runs (Sidecar + the HTTP app, its history
sampler included), scraping N targets, measured from inside its own process.

Prints one JSON line when done: CPU seconds of the process (all its threads) over the measured
span, scrapes and their durations, RSS (now and peak), and the event loop's stalls: a coroutine
sleeps 10 ms in a loop and records how late it wakes. `--idle` runs only that coroutine, in a
process doing nothing else: the machine's own lateness at the same time, for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

TICK = 0.010
SLOW = 0.020
# (monotonic time at the end, what, seconds): stalls, collections and steps over SLOW, to tell
# what held the loop.
slow_events: list[tuple[float, str, float]] = []


def rss_mb() -> tuple[float, float]:
    cur = peak = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


class GcPauses:
    """How long each collection of the cyclic garbage collector held the process, by generation."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.cpu: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = self._cpu = 0.0
        self.recording = False
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self._cpu = time.thread_time()
        elif self.recording:
            wall = time.perf_counter() - self._started
            self.pauses[info["generation"]].append(wall)
            if wall > SLOW:
                slow_events.append((time.monotonic(), f"gc{info['generation']}", wall))
            self.cpu[info["generation"]].append(time.thread_time() - self._cpu)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for gen, pauses in self.pauses.items():
            out[f"gc{gen}_count"] = len(pauses)
            out[f"gc{gen}_max_ms"] = max(pauses, default=0.0) * 1e3
            # CPU time of the longest: less than its wall time when the machine took the
            # core away meanwhile.
            longest = max(range(len(pauses)), key=pauses.__getitem__, default=None)
            out[f"gc{gen}_max_cpu_ms"] = (
                self.cpu[gen][longest] * 1e3 if longest is not None else 0.0
            )
        return out


class Breakdown:
    """CPU time (of the calling thread) spent in the sidecar's synchronous steps, each wrapped
    where the sidecar calls it. Inclusive: snapshot() contains groups(). What is left of the
    process' CPU time is aiohttp (fetching, serving), asyncio and the collector."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.recording = False

    def wrap(self, owner: object, name: str, label: str) -> None:
        inner = getattr(owner, name)
        clock = time.thread_time

        def timed(*args: object, **kwargs: object) -> object:
            if not self.recording:
                return inner(*args, **kwargs)
            start = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = clock() - start
                self.seconds[label] = self.seconds.get(label, 0.0) + spent
                self.calls[label] = self.calls.get(label, 0) + 1
                if spent > SLOW:
                    slow_events.append((time.monotonic(), label, spent))

        setattr(owner, name, timed)

    def install(self) -> None:
        from kvoffload.analysis.window import Window
        from kvoffload.ingest import scrape
        from kvoffload.sidecar import history, http, service

        self.wrap(scrape, "parse_text", "parse")
        self.wrap(service, "extract", "extract")
        self.wrap(Window, "update", "window update")
        self.wrap(service, "analyze_group", "analysis (per scrape)")
        self.wrap(service.Sidecar, "groups", "groups() (assembly)")
        self.wrap(service.Sidecar, "snapshot", "snapshot (incl. groups())")
        self.wrap(http, "render_metrics", "/metrics render (thread)")
        self.wrap(http, "_status_json", "status JSON (thread)")
        self.wrap(history.History, "sample", "history sample")

    def summary(self, wall: float) -> dict[str, dict[str, float]]:
        return {
            label: {"core_share": sec / wall, "calls": self.calls[label]}
            for label, sec in sorted(self.seconds.items(), key=lambda kv: -kv[1])
        }


class StallMonitor:
    """How late a 10 ms sleep wakes: the longest time the loop was held by something else."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.longest = (0.0, 0.0)  # (lateness, the process' CPU time meanwhile)
        self.recording = False

    async def run(self) -> None:
        while True:
            start, cpu = time.monotonic(), time.process_time()
            await asyncio.sleep(TICK)
            if self.recording:
                lag = time.monotonic() - start - TICK
                self.lags.append(lag)
                if lag > SLOW:
                    slow_events.append((time.monotonic(), "stall", lag))
                if lag > self.longest[0]:
                    self.longest = (lag, time.process_time() - cpu)

    def summary(self) -> dict[str, float]:
        lags = sorted(self.lags) or [0.0]
        return {
            "ticks": len(self.lags),
            "stall_max_ms": lags[-1] * 1e3,
            # The process' CPU time over the longest stall (10 ms sleep + lateness): about
            # the stall when the process was working, far less when the machine took the core.
            "stall_max_cpu_ms": self.longest[1] * 1e3,
            "stall_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1e3,
            "stall_p50_ms": lags[len(lags) // 2] * 1e3,
            "stalls_over_50ms": sum(1 for lag in lags if lag > 0.050),
        }


async def probe(args: argparse.Namespace) -> dict[str, object]:
    monitor = StallMonitor()
    pauses = GcPauses()
    breakdown = Breakdown()
    watch = asyncio.create_task(monitor.run())
    if args.idle:
        await asyncio.sleep(args.warmup)
        monitor.recording = True
        await asyncio.sleep(args.seconds)
        watch.cancel()
        return monitor.summary()

    import logging

    from aiohttp import web
    from targets import addresses

    # Failed scrapes are counted (failed_targets), not logged one by one.
    logging.getLogger("kvoffload").setLevel(logging.ERROR)

    from kvoffload.sidecar.http import make_app
    from kvoffload.sidecar.service import Sidecar, SidecarConfig

    urls = [f"http://{host}:{args.targets_port}/metrics" for host in addresses(args.n)]
    sidecar = Sidecar(SidecarConfig(urls, args.interval, 300.0, 10.0))
    durations: list[float] = []
    original = sidecar.scrape_once

    async def timed(target) -> None:  # type: ignore[no-untyped-def]
        await original(target)
        if monitor.recording and target.up and target.last_duration_seconds is not None:
            durations.append(target.last_duration_seconds)

    sidecar.scrape_once = timed  # type: ignore[method-assign]
    if args.breakdown:
        breakdown.install()
    app = make_app(sidecar)
    gc.freeze()  # as `kvoffload serve` does before it starts
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.listen).start()
    print("listening", flush=True)
    await asyncio.sleep(args.warmup)  # every target scraped at least twice: figures exist
    monitor.recording = pauses.recording = breakdown.recording = True
    profiler = cProfile.Profile() if args.profile else None
    scrapes0 = sum(t.scrapes for t in sidecar.targets)
    cpu0, wall0 = time.process_time(), time.monotonic()
    if profiler is not None:
        profiler.enable()
    await asyncio.sleep(args.seconds)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    monitor.recording = pauses.recording = breakdown.recording = False
    scrapes = sum(t.scrapes for t in sidecar.targets) - scrapes0
    cur, peak = rss_mb()
    failed = sum(1 for t in sidecar.targets if not t.up)
    tracked = gc.get_objects()  # what a full collection of the cyclic collector walks
    kinds = Counter(type(o).__name__ for o in tracked).most_common(12)
    tracked_count = len(tracked)
    del tracked
    groups = len(sidecar.groups())
    watch.cancel()
    await runner.cleanup()
    durations.sort()
    return {
        "targets": args.n,
        "groups": groups,
        "interval_s": args.interval,
        "seconds": wall,
        "cpu_s": cpu,
        "core_share": cpu / wall,
        "scrapes": scrapes,
        "cpu_ms_per_scrape": cpu / max(scrapes, 1) * 1e3,
        "p99_scrape_to_figure_ms": (
            durations[int(0.99 * (len(durations) - 1))] * 1e3 if durations else None
        ),
        "failed_targets": failed,
        "rss_mb": cur,
        "peak_rss_mb": peak,
        "gc_tracked_objects": tracked_count,
        "gc_tracked_kinds": kinds,
        **monitor.summary(),
        **pauses.summary(),
        **({"breakdown": breakdown.summary(wall)} if args.breakdown else {}),
        **({"slow_events": _slow(wall0)} if args.breakdown else {}),
    }


def _slow(since: float) -> list[tuple[float, str, float]]:
    """The slow events of the measured span: (seconds into it, what, milliseconds)."""
    return [(round(t - since, 3), what, round(d * 1e3, 1)) for t, what, d in slow_events]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--targets-port", type=int, default=0)
    ap.add_argument("--listen", type=int, default=0)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--idle", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="CPU time of each step")
    ap.add_argument("--profile", help="cProfile the measured span (the loop's thread) to this file")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(probe(args))), flush=True)


if __name__ == "__main__":
    main()
