"""kvoffload benchmarks (issue 6): cost per scrape, scale, memory, analyze on a long recording.

Every timing is a median of several runs after a warm-up, and every speed figure is a ratio
against a reference measured in the same process, pair by pair, so machine noise cancels.
Prints a table and writes bench/results.json. Run with `make bench` (never part of make test).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import pickle
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from payloads import PAYLOADS, bodies, epoch
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis.analyze import analyze_window
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.ingest.recording import RecordingWriter

HERE = Path(__file__).parent
ROOT = HERE.parent


def rss_mb(pid: str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) in MB from /proc."""
    cur = peak = 0.0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- 1. parse + derive per scrape ------------------------------------------------------------
def bench_parse(repeats: int, rounds: int) -> list[dict[str, object]]:
    rows = []
    for kind in PAYLOADS:
        payloads = bodies(kind, 12)
        texts = [b.decode() for b in payloads]
        t0 = epoch(kind)

        def ours(payloads: list[bytes] = payloads, t0: float = t0) -> None:
            window = Window(300.0)
            for i, body in enumerate(payloads):
                expo = parse_text(body, wanted, WANTED_FAMILIES)
                window.update(extract(expo, t0 + 15.0 * i, "t"))
                analyze_window(window)

        def reference(texts: list[str] = texts) -> None:
            for text in texts:
                for _family in text_string_to_metric_families(text):
                    pass

        ours()
        reference()  # warm-up
        ratios, ours_s, ref_s = [], [], []
        for _ in range(rounds):
            a = _time(ours, repeats) / len(payloads)
            b = _time(reference, repeats) / len(payloads)
            ours_s.append(a)
            ref_s.append(b)
            ratios.append(b / a)
        rows.append(
            {
                "payload": kind,
                "bytes": len(payloads[-1]),
                "lines": payloads[-1].count(b"\n"),
                "ours_parse_derive_ms": statistics.median(ours_s) * 1e3,
                "reference_parse_ms": statistics.median(ref_s) * 1e3,
                "ratio": statistics.median(ratios),
                "goal_ratio_met": statistics.median(ratios) >= 10,
                "goal_1ms_met": None if kind != "1-engine" else statistics.median(ours_s) < 1e-3,
            }
        )
    return rows


def _time(fn, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best.append(time.perf_counter() - start)
    return statistics.median(best)


# -- 2. scale: one sidecar, N targets ---------------------------------------------------------
def bench_scale(ns: list[int], seconds: float, interval: float) -> list[dict[str, object]]:
    from kvoffload.sidecar.service import Sidecar, SidecarConfig

    payloads = bodies("1-engine", 40)
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "bodies.pkl"
        blob.write_bytes(pickle.dumps(payloads))
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, str(HERE / "targets.py"), "--port", str(port), "--bodies", str(blob)]
        )
        try:
            _wait_port(port)
            rows = []
            for n in ns:
                rows.append(
                    asyncio.run(_scale_once(Sidecar, SidecarConfig, port, n, seconds, interval))
                )
            return rows
        finally:
            server.terminate()
            server.wait(10)


async def _scale_once(
    sidecar_cls, config_cls, port: int, n: int, seconds: float, interval: float
) -> dict[str, object]:
    targets = [f"http://127.0.0.1:{port}/t/{i}/metrics" for i in range(n)]
    # Distinct instance names: the path makes each target its own series set.
    sidecar = sidecar_cls(config_cls(targets[:1], interval, 300.0, 10.0))
    sidecar.targets = [type(sidecar.targets[0])(url, f"t{i}") for i, url in enumerate(targets)]
    durations: list[float] = []
    original = sidecar.scrape_once

    async def timed(target) -> None:
        await original(target)
        if target.up and target.last_duration_seconds is not None:
            durations.append(target.last_duration_seconds)

    sidecar.scrape_once = timed
    await sidecar.start()
    await asyncio.sleep(interval * 1.5)  # warm-up: every target scraped once
    durations.clear()
    cpu0, wall0 = time.process_time(), time.monotonic()
    scrapes0 = sum(t.scrapes for t in sidecar.targets)
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    scrapes = sum(t.scrapes for t in sidecar.targets) - scrapes0
    sidecar.groups()  # what a /metrics request pays on top
    await sidecar.stop()
    durations.sort()
    p99 = durations[int(0.99 * (len(durations) - 1))] if durations else None
    core_share = cpu / wall
    return {
        "targets": n,
        "scrapes": scrapes,
        "cpu_ms_per_scrape": cpu / max(scrapes, 1) * 1e3,
        "p99_scrape_to_figure_ms": p99 * 1e3 if p99 is not None else None,
        "core_share": core_share,
        "failed_targets": sum(1 for t in sidecar.targets if not t.up),
        "within_budget": core_share < 0.25,
    }


def _wait_port(port: int) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("target server did not start")


# -- 3. memory --------------------------------------------------------------------------------
def bench_memory(scrapes: int) -> dict[str, object]:
    payloads = bodies("large", 20)
    t0 = epoch("large")
    window = Window(300.0)
    rss_at_100 = None
    for i in range(scrapes):
        body = payloads[i % len(payloads)]
        window.update(extract(parse_text(body, wanted, WANTED_FAMILIES), t0 + 5.0 * i, "t"))
        if i % 10 == 0:
            analyze_window(window)
        if i == 99:
            gc.collect()
            rss_at_100 = rss_mb()[0]
    gc.collect()
    rss_end = rss_mb()[0]
    growth = (rss_end - rss_at_100) / rss_at_100  # type: ignore[operator]
    return {
        "scrapes": scrapes,
        "rss_mb_after_100": rss_at_100,
        "rss_mb_after_all": rss_end,
        "growth": growth,
        "flat_within_5pct": abs(growth) <= 0.05,
    }


def bench_sidecar_peak_rss(seconds: float) -> dict[str, object]:
    """Peak RSS of a real `kvoffload serve` process scraping one large-payload target."""
    payloads = bodies("large", 20)
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "bodies.pkl"
        blob.write_bytes(pickle.dumps(payloads))
        port, side_port = free_port(), free_port()
        server = subprocess.Popen(
            [sys.executable, str(HERE / "targets.py"), "--port", str(port), "--bodies", str(blob)]
        )
        _wait_port(port)
        sidecar = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvoffload",
                "--log-level",
                "error",
                "serve",
                "--target",
                f"http://127.0.0.1:{port}/t/0/metrics",
                "--interval",
                "0.5s",
                "--listen",
                f"127.0.0.1:{side_port}",
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            _wait_port(side_port)
            end = time.time() + seconds
            import urllib.request

            while time.time() < end:  # exercise the HTTP side too
                urllib.request.urlopen(f"http://127.0.0.1:{side_port}/metrics").read()
                urllib.request.urlopen(f"http://127.0.0.1:{side_port}/api/v1/status").read()
                time.sleep(0.5)
            cur, peak = rss_mb(str(sidecar.pid))
        finally:
            sidecar.terminate()
            server.terminate()
            sidecar.wait(10)
            server.wait(10)
    return {"seconds": seconds, "rss_mb": cur, "peak_rss_mb": peak, "under_60mb": peak < 60}


# -- 4. analyze a long recording --------------------------------------------------------------
def bench_analyze(hours_list: list[float], interval: float) -> list[dict[str, object]]:
    payloads = [parse_text(b) for b in bodies("large", 40)]
    rows = []
    for hours in hours_list:
        with tempfile.TemporaryDirectory(dir=os.environ.get("KVO_BENCH_TMP")) as tmp:
            path = Path(tmp) / "long.om"
            n = int(hours * 3600 / interval)
            with open(path, "w") as fh:
                writer = RecordingWriter(fh, instance="vllm:8000")
                for i in range(n):
                    # 40 distinct bodies in a loop: each wrap is a counter reset, which the
                    # reader must handle anyway; the cost per scrape is the same.
                    writer.write_exposition(payloads[i % len(payloads)], 1.8e9 + i * interval)
                writer.close()
            size = path.stat().st_size
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvoffload", "analyze", str(path), "--json"],
                stdout=subprocess.DEVNULL,
            )
            peak = _poll_peak_rss(proc)
            wall = time.monotonic() - start
            rows.append(
                {
                    "hours": hours,
                    "scrapes": n,
                    "file_mb": size / 1e6,
                    "wall_s": wall,
                    "peak_rss_mb": peak,
                    "ok": proc.returncode == 0,
                    "under_10s": wall < 10,
                }
            )
    return rows


def _poll_peak_rss(proc: subprocess.Popen) -> float:
    """The child's own peak RSS (VmHWM), read until it exits: getrusage's children figure
    would count the pages it shared with this (large) process before exec."""
    peak = 0.0
    while proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):  # it may exit between the checks
            peak = max(peak, rss_mb(str(proc.pid))[1])
        time.sleep(0.02)
    return peak


# -- 5. KV events: throughput and memory --------------------------------------------------------
def bench_events(blocks_total: int) -> dict[str, object]:
    """Decode + ingest throughput on the simulator's real wire format, exact vs sampled; then
    memory after `blocks_total` GPU-missed block events (synthetic: many distinct blocks)."""
    from kvoffload.kvevents.decode import decode_batch
    from kvoffload.kvevents.state import TargetEvents
    from kvoffload.sim import SimServer, scenarios
    from kvoffload.sim.kv_events import encode_batch

    sim = SimServer(scenarios.get("rag-hot-set-fits"), kv_events=True)
    sim.advance_to(1800.0)
    payloads = [encode_batch(ts, evs, rank) for rank, ts, evs in sim.drain_kv_events()]
    blocks = sum(len(e.block_hashes) for p in payloads for e in decode_batch(p).events)
    rows: dict[str, object] = {"wire_messages": len(payloads), "wire_blocks": blocks}
    for label, rate, budget in (
        ("exact", 1.0, None),
        ("sampled 1%", 0.01, None),
        ("budget 100k", 1.0, 100_000),
    ):
        runs = []
        for _ in range(3):
            state = TargetEvents(rate, budget)
            start = time.perf_counter()
            for seq, payload in enumerate(payloads):
                state.ingest(decode_batch(payload), seq, 0)
            runs.append(time.perf_counter() - start)
        rows[f"{label} blocks_per_s"] = blocks / statistics.median(runs)

    def memory(rate: float, budget: int | None) -> tuple[float, int]:
        gc.collect()
        before = rss_mb()[0]
        state = TargetEvents(rate, budget)
        eng = state.engine(0)
        eng.block_size = 16
        rng_docs = 2_000_000  # ~32M distinct blocks possible: the exact mode keeps growing
        rng = __import__("random").Random(11)
        gpu: deque[tuple[int, ...]] = deque()  # a 16k-block GPU cache, evicting as vLLM does
        done = 0
        while done < blocks_total:
            doc = rng.randrange(rng_docs)
            hashes = tuple(
                (doc * 1_000_003 + j) * 0x9E3779B97F4A7C15 & (2**64 - 1) for j in range(64)
            )
            eng._gpu_stored(hashes, None)
            gpu.append(hashes)
            if len(gpu) > 256:
                for h in gpu.popleft():
                    eng.gpu_parent.pop(h, None)  # what a GPU BlockRemoved does
            done += 64
        gc.collect()
        return rss_mb()[0] - before, eng.tracker.tracked

    for label, rate, budget in (("sampled budget 100k", 1.0, 100_000), ("exact", 1.0, None)):
        grown, tracked = memory(rate, budget)
        rows[f"{label} rss_growth_mb"] = grown
        rows[f"{label} tracked_blocks"] = tracked
    return rows


def machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(
                line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument(
        "--only",
        choices=["parse", "scale", "memory", "analyze", "events", "fleet"],
        action="append",
    )
    args = ap.parse_args()
    quick = args.quick
    only = set(args.only or ["parse", "scale", "memory", "analyze", "events", "fleet"])
    results: dict[str, object] = {"machine": machine(), "quick": quick}
    print(f"machine: {results['machine']}")
    if "parse" in only:
        rows = bench_parse(repeats=3 if quick else 7, rounds=3 if quick else 5)
        results["parse"] = rows
        print("\n1. parse + derive per scrape vs prometheus_client's parser (parse only)")
        print(
            f"{'payload':10} {'bytes':>8} {'lines':>6} {'ours ms':>8} {'ref ms':>8} {'ratio':>6}"
            "  goals"
        )
        for r in rows:
            goals = "≥10x " + ("met" if r["goal_ratio_met"] else "MISSED")
            if r["goal_1ms_met"] is not None:
                goals += ", <1 ms " + ("met" if r["goal_1ms_met"] else "MISSED")
            print(
                f"{r['payload']:10} {r['bytes']:>8} {r['lines']:>6} "
                f"{r['ours_parse_derive_ms']:>8.3f} {r['reference_parse_ms']:>8.3f} "
                f"{r['ratio']:>6.1f}  {goals}"
            )
    if "scale" in only:
        ns = [1, 16, 64] if quick else [1, 16, 64, 256]
        rows = bench_scale(ns, seconds=6 if quick else 30, interval=5.0)
        results["scale"] = rows
        print("\n2. one sidecar, N targets at 5 s (1-engine payload over loopback)")
        print(f"{'N':>4} {'scrapes':>7} {'cpu ms/scrape':>13} {'p99 ms':>8} {'core':>6}  budget")
        for r in rows:
            p99 = r["p99_scrape_to_figure_ms"]
            print(
                f"{r['targets']:>4} {r['scrapes']:>7} {r['cpu_ms_per_scrape']:>13.2f} "
                f"{p99 if p99 is None else f'{p99:8.2f}':>8} {r['core_share']:>6.1%}  "
                + ("<25% met" if r["within_budget"] else "over 25%")
            )
        under = [r["targets"] for r in rows if r["within_budget"]]
        results["largest_n_within_budget"] = max(under) if under else None
        print(f"largest N within 25% of one core: {results['largest_n_within_budget']}")
    if "memory" in only:
        mem = bench_memory(1_000 if quick else 10_000)
        peak = bench_sidecar_peak_rss(5 if quick else 20)
        results["memory"] = {"window": mem, "sidecar": peak}
        print("\n3. memory (large payload)")
        print(
            f"RSS after 100 scrapes {mem['rss_mb_after_100']:.1f} MB, after "
            f"{mem['scrapes']} {mem['rss_mb_after_all']:.1f} MB: growth {mem['growth']:+.1%} "
            + ("(flat within 5%: met)" if mem["flat_within_5pct"] else "(MISSED)")
        )
        print(
            f"kvoffload serve, one target: peak RSS {peak['peak_rss_mb']:.1f} MB "
            + ("(<60 MB: met)" if peak["under_60mb"] else "(MISSED)")
        )
    if "analyze" in only:
        hours = [0.5, 2.0] if quick else [6.0, 24.0]
        rows = bench_analyze(hours, 15.0)
        results["analyze"] = rows
        print("\n4. analyze a recording at 15 s (large payload)")
        for r in rows:
            print(
                f"{r['hours']:>5.1f} h: {r['scrapes']} scrapes, {r['file_mb']:.0f} MB, "
                f"{r['wall_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB "
                + ("(<10 s: met)" if r["under_10s"] else "(<10 s: MISSED)")
            )
    if "events" in only:
        ev = bench_events(1_000_000 if quick else 10_000_000)
        results["events"] = ev
        print("\n5. KV events (rag-hot-set-fits wire format; memory on a synthetic stream)")
        for key, value in ev.items():
            print(f"  {key}: {value:,.1f}" if isinstance(value, float) else f"  {key}: {value}")
    if "fleet" in only:
        from fleet import bench_fleet

        engines, hours = (20, 1.0) if quick else (1000, 6.0)
        rows = [bench_fleet(engines, hours)]
        if not quick:
            rows.append(bench_fleet(engines, hours, step="60s"))
        results["fleet"] = rows
        print(f"\n6. analyze --prometheus: {engines} engines × {hours:g} h in a real Prometheus")
        for r in rows:
            print(
                f"  {r['step']}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                f"{r['groups']} groups, {r['errors']} errors ({r['progress']}) "
                + ("(<60 s " + ("met" if r["under_60s"] else "MISSED"))
                + (", <500 MB " + ("met" if r["under_500mb"] else "MISSED") + ")")
            )
    out = HERE / ("results-quick.json" if quick else "results.json")
    if args.only and out.exists():
        # A partial run updates its sections and keeps the others.
        merged = json.loads(out.read_text())
        merged.update(results)
        results = merged
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
