"""Shared test helpers: fixture paths, recordings built from the real H200 captures, tiny
HTTP servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import inspect
import io
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from kvoffload.ingest.parse import Exposition, parse_text
from kvoffload.recording.openmetrics import RecordingWriter

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE = FIXTURES / "vllm-0.33-offload-sample.prom"
H200 = FIXTURES / "vllm-0.26-h200-capture"

COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, every: float = 0.1) -> T:
    """Poll `check()` until it returns something true, and return that; fail naming `what`.

    Tests wait on a condition, never on a fixed sleep: a loaded machine only makes them slower.
    An OSError from `check` (nothing listening yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if result := check():
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


async def until(
    what: str, check: Callable[[], Awaitable[T] | T], timeout: float = 60.0, every: float = 0.05
) -> T:
    """`wait_for` inside an event loop: it sleeps with asyncio, so the servers on this loop go
    on serving; `check` may be a coroutine (a request to one of them)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(every)


def h200_scrapes(server: str = "8b-offload") -> list[tuple[float, str]]:
    """(timestamp, body) of every settled scrape of a real H200 run, in order."""
    out = []
    with open(H200 / "ttft.csv") as fh:
        for row in csv.DictReader(fh):
            if row["server"] != server:
                continue
            name = f"batch{row['batch']}-{row['step']}-{row['label']}.settled.prom"
            out.append((float(row["t_epoch"]), (H200 / server / name).read_text()))
    return out


def recording_text(
    scrapes: list[tuple[float, Exposition | str]], instance: str = "vllm:8000"
) -> str:
    buf = io.StringIO()
    writer = RecordingWriter(buf, instance=instance, job="vllm")
    for ts, body in scrapes:
        if isinstance(body, str):
            writer.write_scrape(body, ts)
        else:
            writer.write_exposition(body, ts)
    writer.close()
    return buf.getvalue()


def restarted(expo: Exposition, base: Exposition, restart_time: float) -> Exposition:
    """The same scrape as seen if vLLM had restarted right after `base` was taken: counters
    count from zero since the restart, `_created` moves, and lazily created offload series
    that have not moved since the restart are gone (as on a fresh server)."""
    base_values = {(n, tuple(sorted(lb.items()))): v for n, lb, v, _ in base.samples}
    samples = []
    for name, labels, value, ts in expo.samples:
        key = (name, tuple(sorted(labels.items())))
        if name.endswith("_created"):
            value = restart_time
        elif name.endswith(COUNTER_SUFFIXES) and key in base_values:
            value = value - base_values[key]
            lazy = name.startswith(("vllm:kv_offload_load_", "vllm:kv_offload_store_"))
            if lazy and value == 0:
                continue
        samples.append((name, labels, value, ts))
    return Exposition(families=dict(expo.families), samples=samples)


def parse_all(body: str) -> Exposition:
    return parse_text(body)


@contextlib.asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[int]:
    """Serve an aiohttp app on a free loopback port for the duration of the block."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def tls_ca(work: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA made with the openssl CLI: (certificate, key)."""
    cert, key = work / f"{name}.pem", work / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
        "-days", "1", "-subj", f"/CN=kvoffload test {name}",
    )  # fmt: skip
    return cert, key


def tls_cert(
    work: Path, ca: tuple[Path, Path], name: str, cn: str = "127.0.0.1", client: bool = False
) -> tuple[Path, Path]:
    """A certificate signed by `ca`: for the server at 127.0.0.1, or a client's (`client`)."""
    cert, key, csr, ext = (work / f"{name}.{s}" for s in ("pem", "key", "csr", "cnf"))
    usage = "extendedKeyUsage=clientAuth" if client else "subjectAltName=IP:127.0.0.1"
    ext.write_text(f"{usage}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={cn}"
    )
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "1", "-extfile", ext,
    )  # fmt: skip
    return cert, key


def certificates(work: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (CA, certificate, key)."""
    ca = tls_ca(work)
    cert, key = tls_cert(work, ca, "srv")
    return ca[0], cert, key


def write_simulator_events(
    path: Path, scenario: str, each_tick: Callable[[Any, float], None] | None = None
) -> None:
    """A simulator run's KV events, through vLLM's wire encoding, into an event file (what
    `record --kv-events` writes); each_tick(sim, t) after every scrape interval's events."""
    from kvoffload.kvevents.eventfile import EventFileWriter, RawMessage
    from kvoffload.sim import SimServer, scenarios
    from kvoffload.sim.kv_events import encode_batch

    sc = scenarios.get(scenario)
    sim = SimServer(sc, kv_events=True)
    seqs: dict[int, int] = {}
    with path.open("wb") as out:
        writer = EventFileWriter(out)
        t = 0.0
        while t <= sc.duration_s:
            sim.advance_to(t)
            for rank, ts, events in sim.drain_kv_events():
                seq = seqs.get(rank, 0)
                seqs[rank] = seq + 1
                writer.write(RawMessage(rank, seq, ts, b"kv", encode_batch(ts, events, rank)))
            if each_tick is not None:
                each_tick(sim, t)
            t += sc.scrape_interval_s


# Counter figures of a tier that pays (test_advisor, test_knobs): sums over the window.
PAYING_FIGURES: dict[str, float | None] = {
    "prompt_tokens_per_second": 1000.0,
    "gpu_prefix_hit_ratio": 0.3,
    "speedup": 5.0,
    "reuse_ratio": 0.5,
    "cpu_fill_seconds": 600.0,
    "cpu_capacity_tokens": 40_000.0,
    "gpu_capacity_tokens": 10_000.0,
    "cpu_capacity_bytes": 4 * 2**30,
    "gpu_capacity_bytes": 1 * 2**30,
    "gpu_turnover_seconds": 30.0,
    "cpu_fill_ratio_since_start": 3.0,
    "offload_hit_ratio": 0.4,
}
