"""kvoffload benchmarks (issue 6): cost per scrape, scale, memory, analyze on a long recording.

Every timing is a median of several runs after a warm-up, and every speed figure is a ratio
against a reference measured in the same process, pair by pair, so machine noise cancels.
Prints a table and writes bench/results.json. Run with `make bench` (never part of make test).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import shutil
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


# -- 1. parse per scrape, like for like, and the selective parse + derive --------------------
def _payload_bodies(kind: str) -> tuple[list[bytes], float]:
    if kind == "capture":  # the real vLLM 0.26 server (H200), 12 successive settled scrapes
        return capture_bodies()[-12:], 1.8e9
    return bodies(kind, 12), epoch(kind)


def bench_parse(repeats: int, rounds: int) -> list[dict[str, object]]:
    """Per scrape, four things timed on the same bodies, pair by pair in each round:
    - ours, selective: `parse_text` with the catalog's filter (families and samples kvoffload
      does not read are skipped unparsed), then the window and the whole analysis;
    - ours, full: `parse_text` with no filter: every sample parsed (name, labels, value);
    - prometheus_client's `text_string_to_metric_families`: every sample parsed (the same work
      as ours, full), each family built as an object;
    - promtool check metrics (Go, the Prometheus project's own): the body on stdin, every sample
      parsed by the text parser Prometheus scrapes with, then linted (names, HELP, suffixes);
      one process per call, so its start (an empty body's call) is timed too and taken off.
    """
    promtool = shutil.which("promtool")
    rows = []
    for kind in (*PAYLOADS, "capture"):
        payloads, t0 = _payload_bodies(kind)
        texts = [b.decode() for b in payloads]

        def selective(payloads: list[bytes] = payloads, t0: float = t0) -> None:
            window = Window(300.0)
            for i, body in enumerate(payloads):
                expo = parse_text(body, wanted, WANTED_FAMILIES)
                window.update(extract(expo, t0 + 15.0 * i, "t"))
                analyze_window(window)

        def full(payloads: list[bytes] = payloads) -> None:
            for body in payloads:
                parse_text(body)

        def reference(texts: list[str] = texts) -> None:
            for text in texts:
                for _family in text_string_to_metric_families(text):
                    pass

        def go(payloads: list[bytes] = payloads[-6:]) -> None:
            for body in payloads:
                subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)

        def go_start(payloads: list[bytes] = payloads[-6:]) -> None:
            for _ in payloads:
                subprocess.run([promtool, "check", "metrics"], input=b"", capture_output=True)

        pairs = [("selective", selective, len(payloads)), ("full", full, len(payloads))]
        pairs.append(("reference", reference, len(payloads)))
        if promtool:
            pairs += [("promtool", go, 6), ("promtool_start", go_start, 6)]
        for _name, fn, _count in pairs:
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name, _fn, _count in pairs}
        ratios: dict[str, list[float]] = {"selective": [], "full": [], "promtool": []}
        for _ in range(rounds):
            now = {name: _time(fn, repeats) / count for name, fn, count in pairs}
            for name, value in now.items():
                times[name].append(value)
            ratios["selective"].append(now["reference"] / now["selective"])
            ratios["full"].append(now["reference"] / now["full"])
            if promtool:
                ratios["promtool"].append((now["promtool"] - now["promtool_start"]) / now["full"])
        full_expo = parse_text(payloads[-1])
        kept = parse_text(payloads[-1], wanted, WANTED_FAMILIES)
        med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        rows.append(
            {
                "payload": kind,
                "bytes": len(payloads[-1]),
                "lines": payloads[-1].count(b"\n"),
                "samples": len(full_expo.samples),
                "samples_kept_selective": len(kept.samples),
                "kept_share": len(kept.samples) / len(full_expo.samples),
                "ours_selective_parse_derive_ms": med["selective"],
                "ours_full_parse_ms": med["full"],
                "reference_parse_ms": med["reference"],
                "promtool_check_metrics_ms": med.get("promtool"),
                "promtool_start_ms": med.get("promtool_start"),
                "ratio_selective": statistics.median(ratios["selective"]),
                "ratio_selective_spread": _spread(ratios["selective"]),
                "ratio_full": statistics.median(ratios["full"]),
                "ratio_full_spread": _spread(ratios["full"]),
                # From the medians: a round's difference of two process starts is mostly noise.
                "promtool_over_ours_full": (
                    (med["promtool"] - med["promtool_start"]) / med["full"] if promtool else None
                ),
                "promtool_over_ours_full_spread": _spread(ratios["promtool"]) if promtool else None,
                "goal_ratio_met": statistics.median(ratios["selective"]) >= 10,
                "goal_1ms_met": None if kind != "1-engine" else med["selective"] < 1.0,
            }
        )
    return rows


def _ratio(median: float, spread: list[float]) -> str:
    return f"{median:.1f}x [{spread[0]:.1f}–{spread[1]:.1f}]"


def _spread(values: list[float]) -> list[float]:
    """[lowest, highest] of the rounds."""
    return [min(values), max(values)] if values else []


def _time(fn, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best.append(time.perf_counter() - start)
    return statistics.median(best)


# -- 2. scale: one sidecar, N real targets on their own loopback addresses ---------------------
CAPTURE = ROOT / "tests" / "fixtures" / "vllm-0.26-h200-capture" / "8b-offload"
# What Prometheus 2.x asks for: OpenMetrics first (the sidecar renders that flavour for it).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


WINDOW_SECONDS = 300.0  # the sidecar's default window (SidecarConfig), as serve runs it


def capture_bodies() -> list[bytes]:
    """The real vLLM 0.26 server's settled /metrics bodies (H200 capture, offloading on), in
    the order they were captured: each target serves them in turn, so its counters move (and
    wrap once every 25 scrapes, a restart) and the analysis does its real work."""
    return [p.read_bytes() for p in sorted(CAPTURE.glob("batch*.settled.prom"))]


def bench_scale(
    ns: list[int],
    seconds: float,
    interval: float,
    metrics_every: float = 15.0,
    profile: str | None = None,
    breakdown: bool = False,
    warmup: float | None = None,
    steady: bool = False,
) -> list[dict[str, object]]:
    """warmup: before measuring (default: two intervals, every group has figures). steady:
    the largest N waits until the sidecar's 300 s window is full (its memory at its steady
    size, its scrapes all packed) before measuring. breakdown: CPU per step for the largest."""
    from targets import addresses

    payloads = capture_bodies()
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "bodies.pkl"
        blob.write_bytes(pickle.dumps(payloads))
        port = free_port()
        server = subprocess.Popen(
            [
                *(sys.executable, str(HERE / "targets.py"), "--port", str(port)),
                *("--bodies", str(blob), "--addresses", str(max(ns))),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            for host in addresses(max(ns))[:: max(1, max(ns) // 4)]:
                _wait_port(port, host)
            rows = []
            for n in ns:
                row = _scale_once(
                    port,
                    n,
                    seconds,
                    interval,
                    metrics_every,
                    profile,
                    breakdown and n == max(ns),
                    warmup
                    if warmup is not None
                    else (WINDOW_SECONDS if steady and n == max(ns) else 0.0) + 2 * interval + 2.0,
                )
                row["body_bytes"] = max(len(b) for b in payloads)
                rows.append(row)
            return rows
        finally:
            server.terminate()
            server.wait(10)


def _scale_once(
    port: int,
    n: int,
    seconds: float,
    interval: float,
    metrics_every: float,
    profile: str | None,
    breakdown: bool,
    warmup: float,
) -> dict[str, object]:
    """One sidecar process scraping n targets every `interval`, its /metrics read every
    `metrics_every` s as Prometheus would; an idle process measures the machine's own lateness
    at the same time."""
    import threading
    import urllib.request

    side_port = free_port()
    probe = HERE / "sidecar_probe.py"
    common = ["--warmup", str(warmup), "--seconds", str(seconds)]
    sidecar = subprocess.Popen(
        [
            *(sys.executable, str(probe), "--n", str(n), "--targets-port", str(port)),
            *("--listen", str(side_port), "--interval", str(interval), *common),
            *(("--profile", f"{profile}.{n}") if profile else ()),
            *(("--breakdown",) if breakdown else ()),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    idle = subprocess.Popen(
        [sys.executable, str(probe), "--idle", *common], stdout=subprocess.PIPE, text=True
    )
    assert sidecar.stdout is not None and sidecar.stdout.readline().strip() == "listening"
    renders: list[tuple[float, float, int]] = []  # (when, seconds, bytes)
    stop = threading.Event()

    def prometheus() -> None:
        started = time.monotonic()
        while not stop.wait(1.0 if not renders else metrics_every):
            req = urllib.request.Request(
                f"http://127.0.0.1:{side_port}/metrics",
                headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
            )
            t = time.monotonic()
            try:
                size = len(urllib.request.urlopen(req, timeout=30).read())
            except OSError:
                continue
            renders.append((t - started, time.monotonic() - t, size))

    client = threading.Thread(target=prometheus, daemon=True)
    client.start()
    out, _ = sidecar.communicate(timeout=warmup + seconds + 120)
    stop.set()
    client.join(35)
    idle_out, _ = idle.communicate(timeout=60)
    row = json.loads(out.strip().splitlines()[-1])
    reference = json.loads(idle_out.strip().splitlines()[-1])
    measured = [r for r in renders if warmup <= r[0] <= warmup + seconds]
    row["metrics_requests"] = len(measured)
    row["metrics_ms_max"] = max((r[1] for r in measured), default=0.0) * 1e3
    row["metrics_bytes"] = max((r[2] for r in measured), default=0)
    row["idle_stall_max_ms"] = reference["stall_max_ms"]
    row["idle_stall_p99_ms"] = reference["stall_p99_ms"]
    row["warmup_s"] = warmup
    row["load_avg_1m"] = round(os.getloadavg()[0], 2)
    row["within_budget"] = (
        row["core_share"] < 0.25 and row["stall_max_ms"] <= 50 and row["peak_rss_mb"] < 150
    )
    return row


def _wait_port(port: int, host: str = "127.0.0.1") -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
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
# -- 5. KV events: throughput and memory --------------------------------------------------------
def bench_events(blocks_total: int) -> dict[str, object]:
    """Decode + ingest throughput on the simulator's real wire format, exact vs sampled; then
    memory after `blocks_total` GPU-missed block events (synthetic: many distinct blocks)."""
    from kvoffload.kvevents.decode import STORED, decode_batch
    from kvoffload.kvevents.state import GPU_MEDIA, TargetEvents
    from kvoffload.sim import SimServer, scenarios
    from kvoffload.sim.kv_events import encode_batch

    sim = SimServer(scenarios.get("rag-hot-set-fits"), kv_events=True)
    sim.advance_to(1800.0)
    payloads = [encode_batch(ts, evs, rank) for rank, ts, evs in sim.drain_kv_events()]
    events = [e for p in payloads for e in decode_batch(p).events]
    blocks = sum(len(e.block_hashes) for e in events)
    # The rate is per GPU-missed block (the blocks of GPU BlockStored events: what the tracker
    # looks up), not per block on the wire (removals and CPU stores too; 48% are GPU-missed).
    missed = sum(len(e.block_hashes) for e in events if e.kind == STORED and e.medium in GPU_MEDIA)
    rows: dict[str, object] = {
        "wire_messages": len(payloads),
        "wire_blocks": blocks,
        "gpu_missed_blocks": missed,
    }
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
        rows[f"{label} gpu_missed_blocks_per_s"] = missed / statistics.median(runs)

    # Memory, each in a fresh process (RSS growth not hidden by memory freed earlier here):
    # the default budget (1M blocks per engine, `kvoffload serve`), a small budget, and exact
    # mode at 1M and at `blocks_total` blocks; bytes per tracked block from RSS and, on a
    # shorter run (tracing every allocation is slow), from tracemalloc.
    runs = [
        ("budget 100k", blocks_total, 100_000, False),
        ("budget 1M (serve default)", blocks_total, 1_000_000, False),
        ("exact 1M", 1_000_000, None, False),
        ("exact", blocks_total, None, False),
        ("exact traced", 200_000 if blocks_total <= 1_000_000 else 1_000_000, None, True),
    ]
    for label, total, budget, traced in runs:
        if label == "exact" and total == 1_000_000:
            continue  # the same as "exact 1M"
        code = (
            f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import run; "
            f"print(json.dumps(run.events_memory({total}, {budget}, {traced})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        for key, value in json.loads(out.splitlines()[-1]).items():
            rows[f"{label} {key}"] = value
    return rows


def events_memory(blocks_total: int, budget: int | None, traced: bool) -> dict[str, float]:
    """One engine's event state after `blocks_total` GPU-missed blocks of a synthetic stream
    (64-block documents drawn from 2M, so ~32M distinct blocks possible: exact mode keeps
    growing; a 16k-block GPU cache evicting as vLLM does): RSS growth (or traced bytes) per
    tracked block."""
    import random
    import tracemalloc

    from kvoffload.kvevents.state import TargetEvents

    gc.collect()
    if traced:
        tracemalloc.start()
    before = rss_mb()[0]
    state = TargetEvents(1.0, budget)
    eng = state.engine(0)
    eng.block_size = 16
    rng = random.Random(11)
    gpu: deque[tuple[int, ...]] = deque()
    done = 0
    start = time.process_time()
    while done < blocks_total:
        doc = rng.randrange(2_000_000)
        hashes = tuple((doc * 1_000_003 + j) * 0x9E3779B97F4A7C15 & (2**64 - 1) for j in range(64))
        eng._gpu_stored(hashes, None)
        gpu.append(hashes)
        if len(gpu) > 256:
            for h in gpu.popleft():
                eng.gpu_parent.pop(h, None)  # what a GPU BlockRemoved does
        done += 64
    cpu = time.process_time() - start
    del gpu
    gc.collect()
    tracked = eng.tracker.tracked
    if traced:
        size = tracemalloc.get_traced_memory()[0]
        return {"tracked_blocks": tracked, "traced_bytes_per_block": size / tracked}
    grown = rss_mb()[0] - before
    return {
        "tracked_blocks": tracked,
        "rss_growth_mb": grown,
        "rss_bytes_per_block": grown * 2**20 / tracked,
        "blocks_per_cpu_s": blocks_total / cpu,
    }


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
        # Other work on the machine meanwhile: the 1/5/15-minute run-queue averages at the start.
        "load_avg": [round(x, 2) for x in os.getloadavg()],
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
        print(
            "\n1. parse per scrape (ms); ratios pair by pair, median [lowest–highest] of the rounds"
        )
        print(
            "  like for like: ours full parse vs prometheus_client's full parse (both parse every "
            "sample: name, labels, value)"
        )
        print(
            f"  {'payload':10} {'bytes':>8} {'samples':>7} {'ours full':>9} "
            f"{'prom_client':>11} {'ratio':>18}"
        )
        for r in rows:
            print(
                f"  {r['payload']:10} {r['bytes']:>8} {r['samples']:>7} "
                f"{r['ours_full_parse_ms']:>9.3f} {r['reference_parse_ms']:>11.3f} "
                f"{_ratio(r['ratio_full'], r['ratio_full_spread']):>18}"
            )
        print(
            "  selective: ours parse with the catalog's filter (keeps the share of samples shown) "
            "+ window + analysis vs prometheus_client's full parse (not the same work)"
        )
        print(
            f"  {'payload':10} {'kept':>6} {'ours sel.':>9} {'prom_client':>11} {'ratio':>18}"
            "  goals"
        )
        for r in rows:
            goals = "≥10x " + ("met" if r["goal_ratio_met"] else "MISSED")
            if r["goal_1ms_met"] is not None:
                goals += ", <1 ms " + ("met" if r["goal_1ms_met"] else "MISSED")
            print(
                f"  {r['payload']:10} {r['kept_share']:>6.0%} "
                f"{r['ours_selective_parse_derive_ms']:>9.3f} {r['reference_parse_ms']:>11.3f} "
                f"{_ratio(r['ratio_selective'], r['ratio_selective_spread']):>18}  {goals}"
            )
        if rows[0]["promtool_check_metrics_ms"] is not None:
            print(
                "  Go reference: promtool check metrics (body on stdin: parses every sample, lints "
                "names/HELP/suffixes), per call, with its process start (an empty body's call); "
                "the ratio takes the start off (medians; the spread is of rounds, mostly the "
                "start's noise)"
            )
            print(
                f"  {'payload':10} {'promtool':>9} {'start':>7} {'ours full':>9} "
                f"{'(promtool - start) / ours full':>30}"
            )
            for r in rows:
                go = _ratio(r["promtool_over_ours_full"], r["promtool_over_ours_full_spread"])
                print(
                    f"  {r['payload']:10} {r['promtool_check_metrics_ms']:>9.2f} "
                    f"{r['promtool_start_ms']:>7.2f} {r['ours_full_parse_ms']:>9.3f} {go:>30}"
                )
        else:
            print("  Go reference: promtool not installed (make system-deps)")
    if "scale" in only:
        ns = [256, 1024] if quick else [64, 256, 1024]
        rows = bench_scale(
            ns, seconds=30 if quick else 90, interval=15.0, breakdown=True, steady=not quick
        )
        results["scale"] = rows
        print(
            "\n2. one sidecar process, N real targets on their own loopback addresses at 15 s "
            f"(the real vLLM 0.26 H200 capture, {rows[0]['body_bytes']:,} B bodies), its /metrics "
            "read every 15 s as Prometheus does (OpenMetrics)"
        )
        print(
            f"{'N':>5} {'warm-up':>7} {'scrapes':>7} {'cpu ms/scrape':>13} {'core':>6} "
            f"{'stall max/p99 ms':>16} {'idle proc':>10} {'full GC ms':>10} {'/metrics ms':>11} "
            f"{'peak RSS':>9}  budget (<25% core, stall ≤50 ms, <150 MB)"
        )
        for r in rows:
            print(
                f"{r['targets']:>5} {r['warmup_s']:>6.0f}s {r['scrapes']:>7} "
                f"{r['cpu_ms_per_scrape']:>13.2f} {r['core_share']:>6.1%} "
                f"{r['stall_max_ms']:>7.1f}/{r['stall_p99_ms']:<8.1f} "
                f"{r['idle_stall_max_ms']:>4.1f}/{r['idle_stall_p99_ms']:<5.1f}"
                f"{r['gc2_max_ms']:>10.1f} {r['metrics_ms_max']:>11.0f} "
                f"{r['peak_rss_mb']:>6.0f} MB  "
                + ("met" if r["within_budget"] else "MISSED")
                + (
                    f" (an idle process was {r['idle_stall_max_ms']:.0f} ms late too: the machine)"
                    if r["stall_max_ms"] > 50 and r["idle_stall_max_ms"] > 50
                    else ""
                )
                + (f" ({r['failed_targets']} targets down)" if r["failed_targets"] else "")
            )
        under = [r["targets"] for r in rows if r["within_budget"]]
        results["largest_n_within_budget"] = max(under) if under else None
        print(
            "stall: how late a 10 ms sleep in the sidecar's event loop woke (max/p99); idle proc: "
            "the same in an idle process meanwhile (the machine's own lateness); full GC: the "
            "longest collection of the oldest generation; /metrics: the slowest read (wall)"
        )
        top = rows[-1]
        if "breakdown" in top:
            parts = ", ".join(
                f"{label} {v['core_share']:.1%}" for label, v in top["breakdown"].items()
            )
            print(
                f"where {top['targets']} targets' {top['core_share']:.1%} goes: {parts}; "
                "the rest is aiohttp (fetching, serving), asyncio and the collector"
            )
        print(f"largest N within budget: {results['largest_n_within_budget']}")
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
        from analyze_bench import bench_analyze as bench_analyze_files
        from analyze_bench import print_rows

        rows = bench_analyze_files([0.5] if quick else [6.0, 24.0], repeats=2 if quick else 5)
        results["analyze"] = rows
        print("\n4. analyze a recording at 15 s (large payload), median of runs")
        print_rows(rows)
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
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average (1/5/15 min) at the end: {results['load_avg_end']}")
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
