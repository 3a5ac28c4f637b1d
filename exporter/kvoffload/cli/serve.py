"""`kvoffload serve`: the sidecar next to vLLM, or a whole fleet read from Prometheus."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import click

from kvoffload import __version__
from kvoffload.cli.flags import (
    DEFAULT_PORT,
    WebFlags,
    describe_option,
    run_app,
    web_options,
)
from kvoffload.errors import InputError
from kvoffload.fleet.options import make_api, prometheus_options, time_range
from kvoffload.links import docs_epilog

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    from kvoffload.analysis.analyze import Settings
    from kvoffload.fleet.promapi import PrometheusAPI
    from kvoffload.sidecar.service import KVEventsSource, Service

from kvoffload.cli.options import make_settings, scrape_timeout_option, settings_options
from kvoffload.flagvalues import duration_callback, duration_or_zero_callback, size_callback


@dataclass(frozen=True)
class _ScrapeFlags:
    """serve's options that only scraping targets uses, handed to serve as one `scrape`.

    Why: they are refused together with --prometheus, and build the sidecar's config together.
    """

    window: float
    host_memory_cgroup: str
    advice_warmup: float
    advice_dwell: float
    scrape_timeout: float
    max_payload: float
    sample_limit: int
    group_limit: int
    label_value_length_limit: int
    kv_events: tuple[str, ...]
    kv_events_replay: tuple[str, ...]
    kv_events_dp: int
    kv_events_topic: str
    kv_events_sample_rate: float
    kv_events_sample_budget: int | None
    state_dir: str | None
    state_interval: float


# serve's options that only scraping targets uses: refused with --prometheus.
_SCRAPE_ONLY = tuple(f.name for f in fields(_ScrapeFlags))
_SCRAPE_ONLY_WHY = (
    "with --prometheus the fleet is read from Prometheus "
    "(no scrapes, no KV events; the figures cover --range)"
)
# ... and those only reading Prometheus uses: refused with --target.
_PROMETHEUS_ONLY = (
    "selector",
    "range_seconds",
    "start",
    "end",
    "step",
    "prometheus_timeout",
    "prometheus_gzip",
    "prometheus_max_answer",
    "prometheus_max_points",
    "bearer_token_file",
    "basic_auth_user",
    "basic_auth_password_file",
    "ca_file",
    "cert_file",
    "key_file",
    "insecure_skip_verify",
    "headers",
)


def _scrape_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Hand the scrape-only options (_ScrapeFlags) to `fn` as one `scrape`.

    Why: serve's own signature then lists what both of its modes use.
    """

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        scrape = _ScrapeFlags(**{name: kwargs.pop(name) for name in _SCRAPE_ONLY})
        return fn(*args, scrape=scrape, **kwargs)

    return command


def _given(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` that the user set (on the command line or the environment)."""
    out = []
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) not in (
            click.core.ParameterSource.DEFAULT,
            None,
        ):
            out.append(describe_option(ctx, param))
    return out


@click.command(epilog=docs_epilog("advisor.md", "metrics.md", "sizing.md"))
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="URL",
    help="vLLM /metrics URL; repeat for several engines/pods.",
)
@web_options(f"0.0.0.0:{DEFAULT_PORT}", "--listen")
@click.option(
    "--interval",
    callback=duration_callback,
    default=None,
    help="Scrape interval per target (default 5s); with --prometheus, how often the fleet "
    "is read again (default 1m).",
)
@click.option(
    "--window",
    callback=duration_callback,
    default="5m",
    show_default=True,
    help="Window the figures are computed over.",
)
@scrape_timeout_option
@click.option(
    "--max-payload",
    callback=size_callback,
    default="16MiB",
    show_default=True,
    help="Largest /metrics body accepted.",
)
@click.option(
    "--scrape.sample-limit",
    "sample_limit",
    type=click.IntRange(0),
    default=20_000,
    show_default=True,
    help="Most vLLM samples the sidecar reads from one scrape (Prometheus' sample_limit; "
    "8 engines × 3 models read ~1,400); over it the scrape fails. 0: no limit.",
)
@click.option(
    "--scrape.group-limit",
    "group_limit",
    type=click.IntRange(0),
    default=64,
    show_default=True,
    help="Most model_name × engine pairs in one scrape of a target; over it the scrape "
    "fails. 0: no limit.",
)
@click.option(
    "--scrape.label-value-length-limit",
    "label_value_length_limit",
    type=click.IntRange(0),
    default=4096,
    show_default=True,
    help="Longest label value (bytes) of a sample read (Prometheus' "
    "label_value_length_limit); over it the scrape fails. 0: no limit.",
)
@click.option(
    "--kv-events",
    "kv_events",
    multiple=True,
    metavar="ENDPOINT",
    help="vLLM's KV-event endpoint (DP rank 0) of the target in the same position; "
    "enables the exact miss-ratio curve.",
)
@click.option(
    "--kv-events-replay",
    multiple=True,
    metavar="ENDPOINT",
    help="vLLM's replay endpoint, paired like --kv-events.",
)
@click.option(
    "--kv-events-dp",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="DP ranks per target (rank N publishes at port + N).",
)
@click.option("--kv-events-topic", default="", help="Topic vLLM publishes on.")
@click.option(
    "--kv-events-sample-rate",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="Share of blocks tracked (SHARDS); 1 = exact.",
)
@click.option(
    "--kv-events-sample-budget",
    type=click.IntRange(1000),
    default=1_000_000,
    show_default=True,
    help="At most this many blocks per engine in each part of the KV-event state: the "
    "reuse-distance tracker (lowers its sampling rate as needed), the GPU prefix map and the "
    "CPU tier's residency (forget their oldest, counted in "
    "kvoffload_kv_events_evicted_blocks_total); ~220 B a block for all three when full: the "
    "default holds at most ~220 MB per DP rank (~55 MB while vLLM removes what it evicts; "
    "measured: +203 MB for 1.2M new blocks), plus ~45 MB per DP rank for the live what-ifs "
    "of store_threshold and ARC (tiers up to 16,384 blocks). ZMQ queues add at most 64 MiB a "
    "socket.",
)
@click.option(
    "--host-memory.cgroup",
    "host_memory_cgroup",
    default="auto",
    show_default=True,
    metavar="DIR|auto|off",
    help="vLLM's container memory, for the OOM check and kvoffload_host_memory_*: a cgroup "
    "directory (v2 or v1; e.g. a read-only mount of vLLM's), auto (the pod's cgroup less "
    "this container's where visible, else that of vLLM's processes where this process sees "
    "them: shareProcessNamespace or one container) or off.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the KV-event state here (one file per target): a restarted sidecar "
    "resumes from it and asks vLLM to replay what it missed.",
)
@click.option(
    "--state-interval",
    callback=duration_callback,
    default="10s",
    show_default=True,
    help="How often the KV-event state is saved (and always at SIGTERM).",
)
@click.option(
    "--advice-warmup",
    callback=duration_or_zero_callback,
    default="2m",
    show_default=True,
    help="Data time after a start or a change of the tier before the advice is judged "
    "(until then: keep / leave_off, saying so). 0 judges at once.",
)
@click.option(
    "--advice-dwell",
    callback=duration_or_zero_callback,
    default="3m",
    show_default=True,
    help="How long a new action (or a size more than 25%% / 1 GiB away) must hold before "
    "it replaces the published one. 0 publishes each judgement as it comes.",
)
@settings_options
@prometheus_options
@_scrape_flags
def serve(
    targets: tuple[str, ...],
    web: WebFlags,
    scrape: _ScrapeFlags,
    interval: float | None,
    world_size: int,
    memory_limit: float | None,
    kv_bytes_per_token: float | None,
    thresholds_file: str | None,
    threshold_overrides: tuple[str, ...],
    prometheus_url: str | None,
    selector: str | None,
    range_seconds: float | None,
    start: str | None,
    end: str | None,
    step: float | None,
    prometheus_timeout: float,
    **auth: Any,
) -> None:
    """Run the sidecar next to `vllm serve`, or for a fleet read from Prometheus.

    With --prometheus it reads the last --range (or --start/--end) every --interval."""
    if bool(targets) == (prometheus_url is not None):
        raise InputError("give --target URL (repeatable) or --prometheus URL, one of them")
    ctx = click.get_current_context()
    settings = make_settings(
        world_size, memory_limit, thresholds_file, threshold_overrides, kv_bytes_per_token
    )
    if prometheus_url is not None:
        _refuse(ctx, _SCRAPE_ONLY, _SCRAPE_ONLY_WHY)
        fixed = None if start is None and end is None else time_range(range_seconds, start, end)
        api = make_api(prometheus_url, prometheus_timeout, **auth)
        _serve_fleet(api, fixed, range_seconds, selector, step, interval, settings, web)
        return
    _refuse(ctx, _PROMETHEUS_ONLY, "only with --prometheus")
    _serve_targets(targets, scrape, interval if interval is not None else 5.0, settings, web)


def _serve_targets(
    targets: tuple[str, ...],
    scrape: _ScrapeFlags,
    interval: float,
    settings: Settings,
    web: WebFlags,
) -> None:
    """`serve --target`: the sidecar scraping the targets every `interval` seconds.

    Why: the scrape-only options become the sidecar's config here, and nowhere else.
    """
    from kvoffload.analysis.stability import StabilityRules
    from kvoffload.sidecar.service import ScrapeLimits, Sidecar, SidecarConfig

    sources = _kv_events_sources(
        targets,
        scrape.kv_events,
        scrape.kv_events_replay,
        scrape.kv_events_dp,
        scrape.kv_events_topic,
        scrape.state_dir,
    )
    limits = ScrapeLimits(scrape.sample_limit, scrape.group_limit, scrape.label_value_length_limit)
    warmup, dwell = scrape.advice_warmup, scrape.advice_dwell
    rules = StabilityRules(warmup, dwell) if warmup or dwell else None
    config = SidecarConfig(
        list(targets),
        interval,
        scrape.window,
        scrape.scrape_timeout,
        int(scrape.max_payload),
        settings,
        sources,
        scrape.kv_events_sample_rate,
        scrape.kv_events_sample_budget,
        scrape.state_dir,
        scrape.state_interval,
        limits,
        rules,
        scrape.host_memory_cgroup,
    )
    _run(Sidecar(config), f"scraping {', '.join(targets)} every {interval:g} s", web)


def _refuse(ctx: click.Context, names: tuple[str, ...], why: str) -> None:
    """Refuse the options among `names` that the user set, saying `why`."""
    refused = _given(ctx, names)
    if refused:
        raise InputError(f"{', '.join(refused)}: {why}")


def _serve_fleet(
    api: PrometheusAPI,
    fixed: tuple[float, float] | None,
    range_seconds: float | None,
    selector: str | None,
    step: float | None,
    interval: float | None,
    settings: Settings,
    web: WebFlags,
) -> None:
    """`serve --prometheus`: the fleet's figures re-read from Prometheus every --interval."""
    from kvoffload.fleet.service import FleetConfig, FleetService

    fleet = FleetService(
        FleetConfig(
            range_seconds if range_seconds is not None else 3600.0,
            fixed,
            selector,
            step,
            interval if interval is not None else 60.0,
            settings,
        ),
        api,
    )
    span = (
        f"{fixed[0]:.0f} to {fixed[1]:.0f}"
        if fixed
        else f"the last {fleet.config.range_seconds:g} s"
    )
    _run(
        fleet,
        f"reading the fleet from {fleet.api.base} ({span}) every "
        f"{fleet.config.interval_seconds:g} s",
        web,
    )


def _kv_events_sources(
    targets: tuple[str, ...],
    kv_events: tuple[str, ...],
    kv_events_replay: tuple[str, ...],
    dp: int,
    topic: str,
    state_dir: str | None,
) -> list[KVEventsSource]:
    """Each --kv-events endpoint paired by position with its --target (and --kv-events-replay)."""
    from kvoffload.sidecar.service import KVEventsSource

    if len(kv_events) > len(targets) or len(kv_events_replay) > len(kv_events):
        raise InputError(
            "--kv-events pairs with --target (and --kv-events-replay with "
            "--kv-events) by position: too many given"
        )
    sources = [
        KVEventsSource(
            url,
            endpoint,
            kv_events_replay[i] if i < len(kv_events_replay) else None,
            dp,
            topic,
        )
        for i, (url, endpoint) in enumerate(zip(targets, kv_events, strict=False))
    ]
    if state_dir and not sources:
        click.echo(
            "kvoffload: --state-dir keeps the KV-event state; without --kv-events "
            "there is none to keep",
            err=True,
        )
    return sources


def _run(service: Service, doing: str, web: WebFlags) -> None:
    """Serve `service`'s /metrics, status and page until SIGTERM or Ctrl-C."""
    import gc

    from kvoffload.sidecar.http import make_app

    app = make_app(service, metrics_path=web.telemetry_path)
    # What exists now (the imports, the service) lives as long as the process: frozen, it is
    # out of the cyclic collector's full collections, which hold the event loop while they
    # walk (with 1,000 targets, a third fewer objects to walk).
    gc.freeze()
    run_app(
        app,
        web,
        lambda url: logging.getLogger("kvoffload").info(
            "kvoffload %s: %s; metrics at %s", __version__, doing, url
        ),
    )
