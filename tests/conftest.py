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
from collections.abc import Callable, Iterator
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


# (journal, finished file) of a simulator scenario recorded at 15 s as one instance.
SimRecording = Callable[..., tuple[Path, Path]]


@pytest.fixture(scope="session")
def sim_recording(tmp_path_factory: pytest.TempPathFactory) -> SimRecording:
    """`sim_recording(scenario, instance, seconds=None)`: the journal `record` writes of a
    simulator scenario scraped every 15 s as `instance`, and the finished file, made once a run.

    The simulator is seeded, so files asking for the same run can share it (1.5 s each);
    they only read it (copy it first to change it). `seconds` None: the scenario's length."""
    from kvoffload.recording.openmetrics import finalize_journal
    from kvoffload.sim import scenarios
    from kvoffload.sim.write_recording import record_scenario

    work = tmp_path_factory.mktemp("sim-recordings")
    made: dict[tuple[str, str, float], tuple[Path, Path]] = {}

    def recorded(name: str, instance: str, seconds: float | None = None) -> tuple[Path, Path]:
        scenario = scenarios.get(name)
        span = scenario.duration_s if seconds is None else seconds
        key = (name, instance, span)
        if key not in made:
            stem = f"{name}-{instance.replace(':', '_')}-{span:g}"
            journal, out = work / f"{stem}.om", work / f"{stem}.strict.om"
            record_scenario(scenario, str(journal), span, 15.0, instance=instance)
            finalize_journal(str(journal), str(out))
            made[key] = (journal, out)
        return made[key]

    return recorded


@pytest.fixture(scope="session")
def laptop_sim() -> Iterator[str]:
    """`kvoffload sim --scenario laptop-eviction --speed 60`, one a run: its /metrics URL.

    For tests that only scrape it and take whatever moment of the run they come to (its clock
    runs from the first test that asks): a test of what the run shows from its start keeps
    its own."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", "sim", "--scenario", "laptop-eviction",
         "--speed", "60", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for("the laptop-eviction simulator", lambda: urllib.request.urlopen(url, timeout=5))
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
