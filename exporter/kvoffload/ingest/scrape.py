"""Reading a target's /metrics, the one way the sidecar, `record` and `analyze --target` do it.

A fetch bounded in time and size (each failure one line), the parse, and the scrape's time. That
time is the samples' own timestamps when set (as Prometheus honours them), else the fetch's moment.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from kvoffload.errors import InputError
from kvoffload.ingest.catalog import believable
from kvoffload.ingest.parse import Exposition, LimitError, Limits, Sample, parse_text

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "kvoffload"


class ScrapeError(InputError):
    """The target could not be read; the message is one line for logs and the status page."""


class ScrapeLimitError(ScrapeError):
    """The target's payload is over a limit of the scrape; `limit` names which (`samples`,
    `label_value_length`, `groups`)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass
class ScrapeResult:
    body: bytes
    duration_seconds: float
    timestamp: float


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    timeout_seconds: float = 10.0,
    max_bytes: int = 16 * 2**20,
) -> ScrapeResult:
    start = time.monotonic()
    timestamp = time.time()
    try:
        async with asyncio.timeout(timeout_seconds):
            async with session.get(
                url,
                headers={"Accept": ACCEPT, "User-Agent": USER_AGENT},
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    reason = (resp.reason or "").strip()
                    raise ScrapeError(f"{url}: HTTP {resp.status} {reason}".rstrip())
                length = resp.content_length
                if length is not None and length > max_bytes:
                    raise ScrapeError(
                        f"{url}: payload of {length} bytes exceeds the {max_bytes}-byte limit"
                    )
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ScrapeError(f"{url}: payload exceeds the {max_bytes}-byte limit")
                    chunks.append(chunk)
                # (a body of 100 MB under a raised --max-payload: ~90 ms to join)
                body = (
                    await off_loop(b"".join, chunks) if size > OFF_LOOP_BYTES else b"".join(chunks)
                )
    except TimeoutError:
        raise ScrapeError(f"{url}: timed out after {timeout_seconds:g} s") from None
    except aiohttp.ClientPayloadError as exc:
        raise ScrapeError(f"{url}: truncated response ({_first_line(exc)})") from None
    except aiohttp.InvalidURL:
        raise ScrapeError(f"{url}: invalid URL") from None
    except aiohttp.ClientConnectorError as exc:
        raise ScrapeError(f"{url}: cannot connect ({_first_line(exc.os_error)})") from None
    except aiohttp.ClientError as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {_first_line(exc)}") from None
    except OSError as exc:
        raise ScrapeError(f"{url}: {_first_line(exc)}") from None
    return ScrapeResult(body, time.monotonic() - start, timestamp)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return (text.splitlines() or [type(exc).__name__])[0][:200]


# A sample's own timestamp is believed only when finite and within a year of the scrape:
# Prometheus refuses samples far outside its head block, and a year covers any virtual clock
# the simulator runs. Beyond it a window would span 1e12 s or NaN.
MAX_TIMESTAMP_SKEW_SECONDS = 365 * 86400.0


@dataclass
class Scrape:
    exposition: Exposition
    timestamp: float  # the scrape's time (see read_numbers)
    fetched_at: float  # wall clock when the request went out
    duration_seconds: float
    payload_bytes: int
    # Samples dropped because a number could not be believed, by reason ("timestamp", "value").
    rejected: dict[str, int] = field(default_factory=dict)


def plausible_timestamp(ts: float, fetched_at: float) -> bool:
    return math.isfinite(ts) and abs(ts - fetched_at) <= MAX_TIMESTAMP_SKEW_SECONDS


def read_numbers(expo: Exposition, fetched_at: float, drop: bool) -> tuple[float, dict[str, int]]:
    """One pass over the samples: the scrape's time, and unbelievable samples counted by reason.

    Why: one bad sample must not poison any target's figures. When `drop`, such samples are made
    unknown; the time honours plausible sample timestamps (a simulator stamps virtual time).
    """
    # A NaN, infinite or far-off timestamp makes the value NaN and drops the stamp. An absurd
    # value is kept: catalog.extract marks that counter unknown, so it is not read as a restart.
    rejected: dict[str, int] = {}
    kept: list[Sample] = []
    latest: float | None = None
    for sample in expo.samples:
        ts, value = sample[3], sample[2]
        if ts is not None and not plausible_timestamp(ts, fetched_at):
            rejected["timestamp"] = rejected.get("timestamp", 0) + 1
            kept.append((sample[0], sample[1], math.nan, None))
            continue
        if not believable(value):
            rejected["value"] = rejected.get("value", 0) + 1
        if ts is not None and (latest is None or ts > latest):
            latest = ts
        kept.append(sample)
    if drop and rejected:
        expo.samples[:] = kept
    return (latest if latest is not None else fetched_at), (rejected if drop else {})


# A body over this is parsed in a worker thread, one at a time: at the limits (20,000 samples
# read, a 16 MiB body) a parse takes 60-90 ms of a loaded core, which the event loop would
# otherwise spend not answering (/healthz, /metrics, the other targets' scrapes). A vLLM body
# of 8 engines × 3 models is ~1 MB; one engine's ~60 kB stays on the loop (a thread hop costs
# more than its parse).
OFF_LOOP_BYTES = 256 * 2**10
_PARSER = ThreadPoolExecutor(1, thread_name_prefix="kvoffload-parse")
_R = TypeVar("_R")


async def off_loop(fn: Callable[..., _R], *args: Any) -> _R:
    """`fn(*args)` in the parser's thread (what a large body costs, off the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(_PARSER, fn, *args)


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    timeout_seconds: float = 10.0,
    max_bytes: int = 16 * 2**20,
    wanted: Callable[[str], bool] | None = None,
    wanted_families: frozenset[str] | None = None,
    check: bool = True,
    limits: Limits | None = None,
) -> Scrape:
    """Fetch and parse one /metrics body (`wanted`: keep only those samples).

    `check` drops samples with unbelievable numbers (read_numbers); `record` keeps what the target
    served. Over one of `limits`: `ScrapeLimitError`.
    """
    result = await fetch(session, url, timeout_seconds, max_bytes)

    def parse() -> tuple[Exposition, float, dict[str, int]]:
        try:
            expo = parse_text(result.body, wanted, wanted_families, limits)
        except LimitError as exc:
            raise ScrapeLimitError(exc.limit, f"{url}: {exc}") from None
        except InputError as exc:
            raise ScrapeError(f"{url}: {exc}") from None
        return expo, *read_numbers(expo, result.timestamp, drop=check)

    if len(result.body) > OFF_LOOP_BYTES:
        expo, timestamp, rejected = await off_loop(parse)
    else:
        expo, timestamp, rejected = parse()
    return Scrape(
        expo,
        timestamp,
        result.timestamp,
        result.duration_seconds,
        len(result.body),
        rejected,
    )


class SyncScraper:
    """`scrape` from synchronous code (`analyze --target`), one connection pool for all."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None

    def scrape(
        self,
        url: str,
        timeout_seconds: float = 10.0,
        max_bytes: int = 16 * 2**20,
        wanted: Callable[[str], bool] | None = None,
        wanted_families: frozenset[str] | None = None,
    ) -> Scrape:
        async def run() -> Scrape:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            return await scrape(
                self._session, url, timeout_seconds, max_bytes, wanted, wanted_families
            )

        return self._loop.run_until_complete(run())

    def close(self) -> None:
        if self._session is not None:
            self._loop.run_until_complete(self._session.close())
        self._loop.close()
