"""The options `analyze --prometheus` and `serve --prometheus` share.

They become a `PrometheusAPI` and a time range."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kvoffload.errors import InputError
from kvoffload.flagvalues import duration_callback, size_callback
from kvoffload.progress import Progress

if TYPE_CHECKING:  # (requests is imported when a Prometheus is read, not by every command)
    from kvoffload.fleet.promapi import PrometheusAPI
    from kvoffload.fleet.source import ReadStats


def _size(ctx: click.Context, param: click.Parameter, value: Any) -> int | None:
    """A size flag of at least 1 KiB (an answer limit below it could hold no answer)."""
    size = size_callback(ctx, param, value)
    if size is None:
        return None
    if size < 1024:
        raise click.BadParameter(f"{value!r}: at least 1KiB")
    return int(size)


def parse_time(value: str, flag: str) -> float:
    """Unix seconds or RFC 3339 (`2026-12-01T10:00:00Z`), like the Prometheus API takes."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{flag} {value!r}: give Unix seconds or an RFC 3339 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def time_range(
    range_seconds: float | None, start: str | None, end: str | None, now: float | None = None
) -> tuple[float, float]:
    """(start, end) from --range, --start and --end: any two of them, or --range (default 1h)
    ending now."""
    end_t = parse_time(end, "--end") if end is not None else None
    start_t = parse_time(start, "--start") if start is not None else None
    if start_t is not None and end_t is not None:
        if range_seconds is not None:
            raise InputError("give at most two of --range, --start and --end")
        return start_t, end_t
    span = range_seconds if range_seconds is not None else 3600.0
    if start_t is not None:
        return start_t, start_t + span
    end_t = end_t if end_t is not None else (now if now is not None else time.time())
    return end_t - span, end_t


def _read_secret(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise InputError(f"{flag} {path}: {exc.strerror}") from None


# What to read: the server and the span of series (prometheus_options).
_WHAT_TO_READ = [
    click.option(
        "--prometheus",
        "prometheus_url",
        default=None,
        metavar="URL",
        help="Read the fleet's vLLM series from this Prometheus-API server "
        "(Prometheus, Thanos Query, Mimir's …/prometheus) instead.",
    ),
    click.option(
        "--selector",
        default=None,
        metavar="'{job=\"vllm\"}'",
        help="With --prometheus: label matchers of the vLLM series.",
    ),
    click.option(
        "--range",
        "range_seconds",
        callback=duration_callback,
        default=None,
        help="With --prometheus: how far back (default 1h), or the span after --start.",
    ),
    click.option("--start", default=None, help="Unix seconds or RFC 3339."),
    click.option("--end", default=None, help="Unix seconds or RFC 3339 (default: now)."),
    click.option(
        "--step",
        callback=duration_callback,
        default=None,
        help="With --prometheus: one point per STEP (query_range) instead of every "
        "stored sample; less to read over long ranges.",
    ),
]
# How to ask: limits on each question, and how to connect and authenticate.
_HOW_TO_ASK = [
    click.option(
        "--prometheus-timeout",
        callback=duration_callback,
        default="2m",
        show_default=True,
        help="Time allowed for each question, all of it (connecting, waiting, reading "
        "the whole answer); each read waits at most as long.",
    ),
    click.option(
        "--prometheus-max-answer",
        callback=_size,
        default="128MiB",
        show_default=True,
        help="Largest answer read, as sent and once inflated; past it the question "
        "fails (asked again for fewer instances).",
    ),
    click.option(
        "--prometheus-max-points",
        type=click.IntRange(1),
        default=1_000_000,
        show_default=True,
        help="Most points and series one answer may hold.",
    ),
    click.option(
        "--prometheus-gzip",
        is_flag=True,
        help="Ask for gzipped answers: less to transfer over a slow link, but "
        "Prometheus spends several times the CPU on them.",
    ),
    click.option("--bearer-token-file", default=None, type=click.Path(dir_okay=False)),
    click.option("--basic-auth-user", default=None),
    click.option("--basic-auth-password-file", default=None, type=click.Path(dir_okay=False)),
    click.option(
        "--ca-file",
        default=None,
        type=click.Path(dir_okay=False),
        help="CA bundle that signed the Prometheus server's certificate.",
    ),
    click.option("--cert-file", default=None, type=click.Path(dir_okay=False)),
    click.option("--key-file", default=None, type=click.Path(dir_okay=False)),
    click.option("--insecure-skip-verify", is_flag=True, help="Do not verify TLS."),
    click.option(
        "--header",
        "headers",
        multiple=True,
        metavar="'NAME: VALUE'",
        help="Extra request header, e.g. 'X-Scope-OrgID: tenant1'; repeatable.",
    ),
]


def prometheus_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How to reach Prometheus and what to read from it."""
    for option in reversed([*_WHAT_TO_READ, *_HOW_TO_ASK]):
        fn = option(fn)
    return fn


def make_api(
    url: str,
    timeout: float,
    prometheus_gzip: bool,
    prometheus_max_answer: int,
    prometheus_max_points: int,
    bearer_token_file: str | None,
    basic_auth_user: str | None,
    basic_auth_password_file: str | None,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    insecure_skip_verify: bool,
    headers: tuple[str, ...],
) -> PrometheusAPI:
    from kvoffload.fleet.promapi import PromAuth, PrometheusAPI, PromLimits

    pairs = []
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise InputError(f"--header {header!r}: use 'Name: value'")
        pairs.append((name.strip(), value.strip()))
    auth = PromAuth(
        bearer_token=_read_secret(bearer_token_file, "--bearer-token-file"),
        username=basic_auth_user,
        password=_read_secret(basic_auth_password_file, "--basic-auth-password-file"),
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        insecure_skip_verify=insecure_skip_verify,
        headers=tuple(pairs),
    )
    limits = PromLimits(max_answer_bytes=prometheus_max_answer, max_points=prometheus_max_points)
    return PrometheusAPI(url, auth, timeout, gzip=prometheus_gzip, limits=limits)


class ReadProgress(Progress):
    """`analyze --prometheus`: instances read, points and questions, as the read goes.
    The last line is written off a terminal too."""

    def __call__(self, stats: ReadStats) -> None:
        self.update(
            f"read {stats.done:,}/{stats.instances:,} instances, {stats.points:,} points in "
            f"{stats.questions:,} questions, {self.elapsed:.1f} s"
            + (f", {len(stats.errors)} failed" if stats.errors else ""),
            force=stats.done == stats.instances,
        )
