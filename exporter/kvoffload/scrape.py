"""Fetching a target's /metrics: bounded in time and size, every failure one line of text."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from kvoffload.errors import InputError

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "kvoffload"


class ScrapeError(InputError):
    """The target could not be read; the message is one line for logs and the status page."""


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
                url, headers={"Accept": ACCEPT, "User-Agent": USER_AGENT},
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
                        raise ScrapeError(
                            f"{url}: payload exceeds the {max_bytes}-byte limit"
                        )
                    chunks.append(chunk)
                body = b"".join(chunks)
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


def fetch_sync(
    url: str, timeout_seconds: float = 10.0, max_bytes: int = 16 * 2**20
) -> ScrapeResult:
    """One blocking scrape (for `record` and `analyze --target`)."""

    async def run() -> ScrapeResult:
        async with aiohttp.ClientSession() as session:
            return await fetch(session, url, timeout_seconds, max_bytes)

    return asyncio.run(run())
