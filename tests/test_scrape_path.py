"""One scrape path (kvoffload.ingest.scrape) for the sidecar, `record` and `analyze --target`: a
target that stamps its samples (a simulator on a virtual clock: 60 virtual seconds per scrape)
gives the same per-second figures everywhere — per second of the target's clock."""

import asyncio
import subprocess
import sys
import threading

from aiohttp import web

from kvoffload.analysis.analyze import analyze_window, window_from_expositions
from kvoffload.cli.analyze import _sample_live
from kvoffload.recording.openmetrics import read_recording
from kvoffload.sidecar.service import Sidecar, SidecarConfig

from helpers import running, until

TOKENS_PER_SCRAPE = 6000.0
VIRTUAL_SECONDS_PER_SCRAPE = 60.0  # → 100 prompt tokens per (virtual) second


def stamped_app() -> web.Application:
    state = {"n": 0}

    async def metrics(_request: web.Request) -> web.Response:
        state["n"] += 1
        n = state["n"]
        ts = 1_800_000_000.0 + VIRTUAL_SECONDS_PER_SCRAPE * n
        body = (
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} '
            f"{TOKENS_PER_SCRAPE * n} {ts * 1000:.0f}\n"
        )
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _serve_in_thread() -> tuple[int, threading.Event]:
    ready, stop = threading.Event(), threading.Event()
    port_box: list[int] = []

    def main() -> None:
        async def serve() -> None:
            async with running(stamped_app()) as port:
                port_box.append(port)
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.02)

        asyncio.run(serve())

    threading.Thread(target=main, daemon=True).start()
    ready.wait(10)
    return port_box[0], stop


def _tokens_per_second(groups: list[dict]) -> float:
    (group,) = [g for g in groups if g["labels"]["model_name"] == "m"]
    return group["figures"]["prompt_tokens_per_second"]


def test_analyze_target_honours_the_targets_clock():
    port, stop = _serve_in_thread()
    try:
        expos = _sample_live(f"http://127.0.0.1:{port}/metrics", duration=0.6, interval=0.1)
        window, scrapes, _ = window_from_expositions(expos)
    finally:
        stop.set()
    assert scrapes >= 4
    assert abs(_tokens_per_second(analyze_window(window)) - 100.0) < 1e-6


def test_the_sidecar_honours_the_targets_clock():
    async def run() -> float:
        async with running(stamped_app()) as port:
            sidecar = Sidecar(
                SidecarConfig(
                    [f"http://127.0.0.1:{port}/metrics"], interval_seconds=0.1, window_seconds=3600
                )
            )
            await sidecar.start()
            try:
                # Polled: a few scrapes, the rate over them (0.6 s of sleep on a quiet machine).
                await until("six scrapes", lambda: sidecar.targets[0].scrapes >= 6)
            finally:
                await sidecar.stop()
            (group,) = [g for g in sidecar.groups() if g.model_name == "m"]
            value = group.figures["prompt_tokens_per_second"]
            assert value is not None
            return value

    assert abs(asyncio.run(run()) - 100.0) < 1e-6


def test_record_writes_the_targets_clock(tmp_path):
    port, stop = _serve_in_thread()
    out = tmp_path / "run.om"
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvoffload",
                "record",
                "--target",
                f"http://127.0.0.1:{port}/metrics",
                "--interval",
                "0.1s",
                "--duration",
                "0.5s",
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop.set()
    assert r.returncode == 0, r.stderr
    window, scrapes, _ = window_from_expositions(read_recording(str(out)))
    assert scrapes >= 3
    assert abs(_tokens_per_second(analyze_window(window)) - 100.0) < 1e-6
