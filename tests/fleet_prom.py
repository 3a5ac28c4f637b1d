"""A real Prometheus holding recordings, for the fleet tests: recordings are backfilled with
`promtool tsdb create-blocks-from openmetrics` (what an operator does with one) and a
Prometheus without scrape targets serves them over its HTTP API."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from helpers import free_port
from rules_procs import PROMETHEUS, PROMTOOL, need


def backfill(recording: Path, tsdb: Path) -> None:
    need(PROMTOOL)
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(recording), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]


@contextlib.contextmanager
def prometheus_on(tsdb: Path, extra_flags: tuple[str, ...] = ()) -> Iterator[str]:
    """Prometheus over an existing TSDB on a free loopback port; yields its URL."""
    need(PROMETHEUS)
    config = tsdb.parent / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    log = tsdb.parent / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                # The recordings live in the simulator's calendar, years ago: keep them.
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *extra_flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
