import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# The real Prometheus/Alertmanager helpers (rules_procs) serve tests outside tests/rules too.
sys.path.insert(0, str(Path(__file__).parent / "rules"))

import asyncio
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from helpers import FIXTURES, free_port, wait_for
from rules_procs import PROMETHEUS, PROMTOOL, need

# The flags every headless load of the status page shares: no network of its own, no first-run
# pages, 5 s of virtual time for the page's script to fetch and draw.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
)


@dataclass(frozen=True)
class Chromium:
    """Debian's headless Chromium: a page's DOM after its script ran, and its screenshot."""

    binary: str

    def argv(self, url: str, profile: str, screenshot: Path | str | None = None) -> list[str]:
        shot = [f"--screenshot={screenshot}", "--window-size=1200,1600"] if screenshot else []
        return [
            self.binary,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            *shot,
            "--dump-dom",
            url,
        ]

    def dom(self, url: str, screenshot: Path | str | None = None, timeout: float = 90) -> str:
        """The DOM of `url`, for a page served by another process (this one blocks)."""
        with tempfile.TemporaryDirectory() as profile:
            r = subprocess.run(
                self.argv(url, profile, screenshot), capture_output=True, text=True, timeout=timeout
            )
        return r.stdout

    async def dom_async(
        self, url: str, screenshot: Path | str | None = None, timeout: float = 90
    ) -> str:
        """The DOM of `url`, for a page served by this event loop (it goes on serving)."""
        with tempfile.TemporaryDirectory() as profile:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(url, profile, screenshot),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        return out.decode()


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    """The one Chromium lookup of a test run; a missing one fails with what to install."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        pytest.fail("chromium missing: run `make system-deps` (Debian package chromium)")
    return Chromium(binary)


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path, once a run; a missing one fails with what to install."""
    need(PROMTOOL)
    return PROMTOOL


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The Prometheus server's path, once a run; a missing one fails with what to install."""
    need(PROMETHEUS)
    return PROMETHEUS


@pytest.fixture(scope="session")
def fixtures_http() -> Iterator[str]:
    """tests/fixtures served over HTTP by one static file server a run; its base URL.

    Each file reads as a /metrics endpoint that never changes (`{url}/{SAMPLE.name}`): tests
    only read it, so they can share the one process instead of starting one each."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(FIXTURES)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the fixture file server", lambda: urllib.request.urlopen(url, timeout=1), 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
