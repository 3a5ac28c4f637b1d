"""The `kvoffload` command: serve (the sidecar), record, analyze, sim and demo."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click
import yaml

from kvoffload import __version__
from kvoffload.analysis.advisor import Thresholds, read_cgroup_memory_limit
from kvoffload.analysis.analyze import Settings, window_from_expositions, window_from_recording
from kvoffload.cli.flags import (
    DEFAULT_PORT,
    ENV_HELP,
    ExporterGroup,
    WebFlags,
    describe_option,
    log_options,
    run_app,
    web_options,
)
from kvoffload.cli.report import render_report
from kvoffload.errors import InputError
from kvoffload.fleet.options import ReadProgress, make_api, prometheus_options, time_range
from kvoffload.fleet.summary import analyze_fleet
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import Exposition
from kvoffload.links import docs_epilog
from kvoffload.overrides import parse_number, split_pair
from kvoffload.progress import FileReadProgress, Progress, format_seconds
from kvoffload.recording import journal_reader as fastjournal
from kvoffload.units import parse_duration, parse_size

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    from kvoffload.fleet.source import ReadStats
    from kvoffload.sidecar.service import Service

EXIT_BAD_INPUT = 2


def _duration(_ctx: click.Context, _param: click.Parameter, value: Any) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def _duration_or_zero(ctx: click.Context, param: click.Parameter, value: Any) -> float | None:
    """A duration where 0 means "none" (the help says so): 0, 0s, 0m all read as 0."""
    if isinstance(value, str) and re.fullmatch(r"0+(\.0*)?(ms|s|m|h)?", value.strip()):
        return 0.0
    return _duration(ctx, param, value)


def _size(_ctx: click.Context, _param: click.Parameter, value: Any) -> float | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def _threshold_number(path: str, key: str, value: object) -> float:
    # YAML 1.1 reads `10e9` (no dot) as a string: accept what float() accepts, nothing else.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise InputError(f"{path}: threshold {key!r} must be a number")


def load_thresholds(path: str | None, overrides: dict[str, float]) -> Thresholds:
    values: dict[str, float] = {}
    if path:
        try:
            with open(path) as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping of threshold names to numbers")
        known = set(Thresholds.__dataclass_fields__)
        for key, value in data.items():
            if key not in known:
                raise InputError(
                    f"{path}: unknown threshold {key!r} (known: {', '.join(sorted(known))})"
                )
            values[key] = _threshold_number(path, key, value)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Thresholds(**values)


def settings_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by serve and analyze: how to read the figures and judge them."""
    for option in reversed(
        [
            click.option(
                "--world-size",
                type=click.IntRange(1),
                default=1,
                show_default=True,
                help="GPUs per engine (TP×PP): vLLM sums copy times over ranks.",
            ),
            click.option(
                "--memory-limit",
                callback=_size,
                default=None,
                help="The vLLM container's memory limit, for the OOM check (default: its "
                "pod's cgroup memory.max less the sidecar's own, where visible; in Kubernetes "
                "set KVOFFLOAD_MEMORY_LIMIT from vLLM's limits.memory, Downward API).",
            ),
            click.option(
                "--thresholds",
                "thresholds_file",
                type=click.Path(dir_okay=False),
                default=None,
                help="YAML file of advisor thresholds (docs: advisor.md, below).",
            ),
            click.option(
                "--kv-bytes-per-token",
                callback=_size,
                default=None,
                help="KV bytes per token (all ranks) when vLLM exposes none (offloading "
                "off, no --kv-cache-memory-bytes): sizes the start of `enable`.",
            ),
            click.option(
                "--threshold",
                "threshold_overrides",
                multiple=True,
                metavar="KEY=VALUE",
                help="One advisor threshold, e.g. min_ttft_saving_seconds=0.01 "
                "(over the YAML file); repeatable.",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def make_settings(
    world_size: int,
    memory_limit: float | None,
    thresholds_file: str | None,
    threshold_overrides: tuple[str, ...] = (),
    kv_bytes_per_token: float | None = None,
) -> Settings:
    limit = memory_limit
    if limit is None and (limit := read_cgroup_memory_limit()) is not None:
        logging.getLogger("kvoffload").info(
            "memory check against %.2f GiB: the pod's cgroup limit less the sidecar's "
            "(--memory-limit to give vLLM's)",
            limit / 2**30,
        )
    overrides: dict[str, float] = {}
    known = set(Thresholds.__dataclass_fields__)
    for item in threshold_overrides:
        key, _, raw = split_pair("--threshold", item, known)
        overrides[key] = parse_number("--threshold", item, raw, float, f"{raw!r} is not a number")
    return Settings(
        world_size, limit, kv_bytes_per_token, load_thresholds(thresholds_file, overrides)
    )


@click.group(
    cls=ExporterGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    params=log_options(defaults=True),
    epilog=ENV_HELP,
)
@click.version_option(
    __version__,
    prog_name="kvoffload",
    message="%(prog)s %(version)s (journal reader: "
    + ("compiled" if fastjournal.COMPILED else "pure Python")
    + ")",
)
def cli() -> None:
    """Is vLLM's CPU KV offloading paying off, and how big should the CPU tier be?"""


# serve's options that only scraping targets uses: refused with --prometheus.
_SCRAPE_ONLY = (
    "window",
    "host_memory_cgroup",
    "advice_warmup",
    "advice_dwell",
    "scrape_timeout",
    "max_payload",
    "sample_limit",
    "group_limit",
    "label_value_length_limit",
    "kv_events",
    "kv_events_replay",
    "kv_events_dp",
    "kv_events_topic",
    "kv_events_sample_rate",
    "kv_events_sample_budget",
    "state_dir",
    "state_interval",
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


@cli.command(epilog=docs_epilog("advisor.md", "metrics.md", "sizing.md"))
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
    callback=_duration,
    default=None,
    help="Scrape interval per target (default 5s); with --prometheus, how often the fleet "
    "is read again (default 1m).",
)
@click.option(
    "--window",
    callback=_duration,
    default="5m",
    show_default=True,
    help="Window the figures are computed over.",
)
@click.option(
    "--scrape.timeout",
    "--scrape-timeout",
    "scrape_timeout",
    callback=_duration,
    default="10s",
    show_default=True,
    help="Longest one scrape of the target may take (--scrape-timeout: the old spelling).",
)
@click.option(
    "--max-payload",
    callback=_size,
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
    "measured: +203 MB for 1.2M new blocks). ZMQ queues add at most 64 MiB a socket.",
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
    callback=_duration,
    default="10s",
    show_default=True,
    help="How often the KV-event state is saved (and always at SIGTERM).",
)
@click.option(
    "--advice-warmup",
    callback=_duration_or_zero,
    default="2m",
    show_default=True,
    help="Data time after a start or a change of the tier before the advice is judged "
    "(until then: keep / leave_off, saying so). 0 judges at once.",
)
@click.option(
    "--advice-dwell",
    callback=_duration_or_zero,
    default="3m",
    show_default=True,
    help="How long a new action (or a size more than 25%% / 1 GiB away) must hold before "
    "it replaces the published one. 0 publishes each judgement as it comes.",
)
@settings_options
@prometheus_options
def serve(
    targets: tuple[str, ...],
    web: WebFlags,
    interval: float | None,
    window: float,
    scrape_timeout: float,
    max_payload: float,
    sample_limit: int,
    group_limit: int,
    label_value_length_limit: int,
    kv_events: tuple[str, ...],
    kv_events_replay: tuple[str, ...],
    kv_events_dp: int,
    kv_events_topic: str,
    kv_events_sample_rate: float,
    kv_events_sample_budget: int | None,
    state_dir: str | None,
    state_interval: float,
    host_memory_cgroup: str,
    advice_warmup: float,
    advice_dwell: float,
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
    """Run the sidecar next to `vllm serve`, or for a whole fleet read from Prometheus
    (--prometheus: the last --range, or --start/--end, re-read every --interval)."""
    from kvoffload.analysis.stability import StabilityRules
    from kvoffload.fleet.service import FleetConfig, FleetService
    from kvoffload.sidecar.service import KVEventsSource, ScrapeLimits, Sidecar, SidecarConfig

    if bool(targets) == (prometheus_url is not None):
        raise InputError("give --target URL (repeatable) or --prometheus URL, one of them")
    ctx = click.get_current_context()
    settings = make_settings(
        world_size, memory_limit, thresholds_file, threshold_overrides, kv_bytes_per_token
    )
    if prometheus_url is not None:
        refused = _given(ctx, _SCRAPE_ONLY)
        if refused:
            raise InputError(
                f"{', '.join(refused)}: with --prometheus the fleet is read from Prometheus "
                "(no scrapes, no KV events; the figures cover --range)"
            )
        fixed = None if start is None and end is None else time_range(range_seconds, start, end)
        fleet = FleetService(
            FleetConfig(
                range_seconds if range_seconds is not None else 3600.0,
                fixed,
                selector,
                step,
                interval if interval is not None else 60.0,
                settings,
            ),
            make_api(prometheus_url, prometheus_timeout, **auth),
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
        return
    refused = _given(ctx, _PROMETHEUS_ONLY)
    if refused:
        raise InputError(f"{', '.join(refused)}: only with --prometheus")
    interval = interval if interval is not None else 5.0
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
            kv_events_dp,
            kv_events_topic,
        )
        for i, (url, endpoint) in enumerate(zip(targets, kv_events, strict=False))
    ]
    if state_dir and not sources:
        click.echo(
            "kvoffload: --state-dir keeps the KV-event state; without --kv-events "
            "there is none to keep",
            err=True,
        )
    sidecar = Sidecar(
        SidecarConfig(
            list(targets),
            interval,
            window,
            scrape_timeout,
            int(max_payload),
            settings,
            sources,
            kv_events_sample_rate,
            kv_events_sample_budget,
            state_dir,
            state_interval,
            ScrapeLimits(sample_limit, group_limit, label_value_length_limit),
            StabilityRules(advice_warmup, advice_dwell) if advice_warmup or advice_dwell else None,
            host_memory_cgroup,
        )
    )
    _run(sidecar, f"scraping {', '.join(targets)} every {interval:g} s", web)


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


@cli.command()
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="URL",
    help="vLLM /metrics URL; repeat for several engines/pods.",
)
@click.option("--interval", callback=_duration, default="15s", show_default=True)
@click.option("--duration", callback=_duration, default="10m", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Recording to write (OpenMetrics, .om). While recording, scrapes go to "
    "OUTPUT.partial (what a killed recorder leaves; `analyze` reads it).",
)
@click.option("--job", default="vllm", show_default=True, help="job label added to every series.")
@click.option(
    "--scrape.timeout",
    "--scrape-timeout",
    "scrape_timeout",
    callback=_duration,
    default="10s",
    show_default=True,
    help="Longest one scrape of the target may take (--scrape-timeout: the old spelling).",
)
@click.option(
    "--kv-events",
    "kv_events",
    default=None,
    metavar="ENDPOINT",
    help="Also record the first target's KV events (vLLM's ZMQ endpoint of DP rank 0).",
)
@click.option("--kv-events-replay", default=None, metavar="ENDPOINT")
@click.option(
    "--kv-events-dp",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="DP ranks to subscribe to (rank N at port + N).",
)
@click.option(
    "--events-output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the event stream (default: OUTPUT.kvev).",
)
@click.option(
    "--finalize",
    "--repair",
    "finalize",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Scrape nothing: turn the journal of a killed recording (OUT.partial, cut at any "
    "byte) into the OpenMetrics file OUT (or --output), then remove it; a recording cut "
    "short (a copy, a full disk) is rewritten in place (or into --output). The last, "
    "possibly partial scrape is dropped; promtool reads the result. Anything that is not "
    "a recording (not a regular file, or not beginning like one) is refused and left as it "
    "is, and the result replaces its input only once it reads as a recording.",
)
def record(
    targets: tuple[str, ...],
    interval: float,
    duration: float,
    output: str | None,
    job: str,
    scrape_timeout: float,
    kv_events: str | None,
    kv_events_replay: str | None,
    kv_events_dp: int,
    events_output: str | None,
    finalize: str | None,
) -> None:
    """Record targets' /metrics into an OpenMetrics file for `analyze` or promtool backfill."""
    import asyncio

    from kvoffload.kvevents.eventfile import open_writer
    from kvoffload.recording.loop import record_targets
    from kvoffload.recording.openmetrics import JOURNAL_SUFFIX, Recording
    from kvoffload.recording.repair import repair
    from kvoffload.sidecar.service import target_name

    if finalize is not None:
        if targets:
            raise InputError("--finalize/--repair scrapes nothing: give no --target")
        journal = finalize.endswith(JOURNAL_SUFFIX)
        if output is None:
            output = finalize[: -len(JOURNAL_SUFFIX)] if journal else finalize
        scrapes = repair(finalize, output)
        if not journal or os.path.abspath(output) == os.path.abspath(finalize):
            click.echo(f"wrote {scrapes} timestamps to {output}", err=True)
            return
        try:
            os.unlink(finalize)
        except OSError as exc:
            raise InputError(f"wrote {output}; cannot remove {finalize}: {exc.strerror}") from None
        click.echo(f"wrote {scrapes} scrapes to {output}; removed {finalize}", err=True)
        return
    if not targets or output is None:
        raise InputError("record needs --target URL and -o/--output FILE")
    pairs = [(url, target_name(url)) for url in targets]
    recording = Recording(output, job=job)
    events_fh = events_writer = None
    if kv_events:
        try:
            events_fh, events_writer = open_writer(events_output or output + ".kvev")
        except InputError:
            recording.discard()  # nothing recorded: no journal left to block the next run
            raise
    failures = 0
    events_failed: OSError | None = None
    # On a terminal: scrapes written and failed as it goes (the final line is below).
    progress = Progress(every=0.5)
    failed = [0]

    def warn(msg: str) -> None:
        failed[0] += 1  # record_targets warns once per failed scrape
        show()
        progress.note(f"kvoffload: warning: {msg}")

    def show() -> None:
        progress.update(
            f"recording {len(pairs)} target(s) every {interval:g} s: {recording.scrapes:,} "
            f"scrapes written, {failed[0]:,} failed, {format_seconds(progress.elapsed)} of "
            f"{format_seconds(duration)}"
        )

    async def run() -> int:
        task = asyncio.ensure_future(
            record_targets(
                pairs,
                interval,
                duration,
                recording,
                scrape_timeout,
                warn,
                (kv_events, kv_events_replay, kv_events_dp) if kv_events else None,
                events_writer,
            )
        )
        while not task.done():
            show()
            await asyncio.wait({task}, timeout=progress.every)
        return task.result()

    # SIGTERM (a pod or a driver stopping it) closes the recording like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        failures = asyncio.run(run())
    except KeyboardInterrupt:
        failures = failed[0]
        progress.clear()
        click.echo("kvoffload: interrupted; closing the recording", err=True)
    finally:
        progress.clear()
        if events_fh is not None:
            try:
                events_fh.close()
            except OSError as exc:  # disk full: the events written whole stay readable
                events_failed = exc
        try:
            recording.close()
        except KeyboardInterrupt:
            # A second signal while the journal is rewritten: the journal is whole; keep it.
            click.echo(
                f"kvoffload: interrupted while writing {output}; the recording is in "
                f"{recording.journal} (`kvoffload record --finalize "
                f"{recording.journal}` finishes it)",
                err=True,
            )
            sys.exit(130)
    click.echo(f"wrote {recording.scrapes} scrapes to {output} ({failures} failed)", err=True)
    if events_failed is not None:
        raise InputError(
            f"{events_output or output + '.kvev'}: {events_failed.strerror}: the KV events "
            "written before it stay"
        )
    if events_writer is not None:
        click.echo(
            f"wrote {events_writer.messages} KV-event messages to "
            f"{events_output or output + '.kvev'}",
            err=True,
        )
    if recording.scrapes == 0:
        raise InputError("no scrape succeeded: the recording is empty")


@cli.command(epilog=docs_epilog("advisor.md", "metrics.md"))
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--target", default=None, metavar="URL", help="Sample a live server instead.")
@click.option(
    "--duration",
    callback=_duration,
    default="60s",
    show_default=True,
    help="With --target: how long to sample.",
)
@click.option(
    "--interval",
    callback=_duration,
    default="5s",
    show_default=True,
    help="With --target: scrape interval.",
)
@click.option(
    "--window",
    callback=_duration,
    default=None,
    help="Only the last WINDOW of the input (default: all of it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON contract instead.")
@click.option(
    "--jobs",
    type=click.IntRange(1),
    default=None,
    help="Worker processes: with --prometheus, and for reading a large recording written "
    "scrape by scrape in parts (default: one per core, up to 4; the figures are those of one "
    "process).",
)
@click.option(
    "--top",
    type=click.IntRange(1),
    default=None,
    help="In the report, only the TOP engines that most need a change (JSON: all).",
)
@click.option(
    "--events",
    "events_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A KV-event stream recorded with `record --kv-events`: adds the exact "
    "miss-ratio curve and sizes from it.",
)
@settings_options
@prometheus_options
def analyze(
    file: str | None,
    target: str | None,
    duration: float,
    interval: float,
    window: float | None,
    as_json: bool,
    jobs: int | None,
    top: int | None,
    events_file: str | None,
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
    """Figures and advice from a recording, a /metrics snapshot, a live server, or a whole
    fleet through Prometheus (--prometheus)."""
    given = [x for x in (file, target, prometheus_url) if x is not None]
    if len(given) != 1:
        raise InputError("give one of FILE, --target URL or --prometheus URL")
    source = given[0]
    settings = make_settings(
        world_size, memory_limit, thresholds_file, threshold_overrides, kv_bytes_per_token
    )
    stats: ReadStats | None = None
    if prometheus_url is not None:
        if events_file is not None:
            raise InputError("--events goes with a recording of one target, not --prometheus")
        from kvoffload.fleet.runs import analyze_from_prometheus
        from kvoffload.fleet.source import FleetReader

        first, last = time_range(range_seconds, start, end)
        progress = ReadProgress()
        reader = FleetReader(
            make_api(prometheus_url, prometheus_timeout, **auth), first, last, selector, step
        )
        try:
            result = analyze_from_prometheus(reader, settings, jobs, progress)
        finally:
            progress.finish()
        groups, summary, scrapes, stats = (
            result.groups,
            result.summary,
            result.scrapes,
            result.stats,
        )
        lifetime = False
    else:
        if file is not None:
            # Bytes of the file read so far: told by the fast readers, else seen from the
            # general reader's descriptor; on a terminal after a second, elsewhere one line
            # for a long read.
            with FileReadProgress(file, Progress(show_after=1.0, final_after=5.0)) as reading:
                win, scrapes, lifetime = window_from_recording(
                    file, window, jobs, report=reading.reached
                )
                reading.items = scrapes
        else:
            expositions = _sample_live(source, duration, interval)
            win, scrapes, lifetime = window_from_expositions(expositions, window)
        events = None
        if events_file is not None:
            from kvoffload.kvevents.replay import load_event_file

            instances = sorted({instance for instance, _model in win.groups()})
            if len(instances) != 1:
                raise InputError("--events needs a recording of exactly one target")
            events = {instances[0]: load_event_file(events_file)}
        groups, summary = analyze_fleet(win, settings, lifetime, (), events)
    errors = stats.errors if stats is not None else {}
    if as_json:
        out: dict[str, object] = {
            "source": source,
            "scrapes": scrapes,
            "lifetime": lifetime,
            "fleet": summary.to_json(),
            "groups": [g.to_json() for g in groups],
        }
        if stats is not None:
            out["errors"] = [{"instance": i, "error": e} for i, e in sorted(errors.items())]
            out["warnings"] = list(stats.warnings)
            out["warning_counts"] = [{"warning": w, "count": n} for w, n in stats.warnings.items()]
            if stats.other_warnings:
                out["other_warnings"] = stats.other_warnings
        click.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    note = f"{scrapes} scrape(s)" + (
        "; one snapshot: lifetime totals since the engine started" if lifetime else ""
    )
    if stats is not None:
        note += f" from {stats.instances:,} instance(s)" + "".join(
            f"\n! {w}" for w in stats.warning_lines()
        )
    shown = groups[:top] if top is not None else groups
    if len(shown) < len(groups):
        note += f"\nthe {len(shown)} of {len(groups)} engines that most need a change:"
    click.echo(render_report(shown, source, note, summary, errors), nl=False)


def _sample_live(url: str, duration: float, interval: float) -> Iterator[Exposition]:
    """Scrape `url` every `interval` for `duration`, the sidecar's way (kvoffload.ingest.scrape).

    A first scrape without vLLM metrics ends it at once (the whole --duration would only say
    the same); each scrape after it is one progress line on stderr, so a long run is not
    silent."""
    from kvoffload.ingest.catalog import extract
    from kvoffload.ingest.scrape import SyncScraper
    from kvoffload.sidecar.service import target_name

    name = target_name(url)
    started_at = time.monotonic()
    deadline = started_at + duration
    scraper = SyncScraper()
    progress = Progress(show_after=1.0, final_after=5.0)
    progress.note(
        f"analyze --target: scraping {url} every {format_seconds(interval)} for "
        f"{format_seconds(duration)}"
    )
    count = 0
    try:
        while True:
            started = time.monotonic()
            result = scraper.scrape(url, wanted=wanted, wanted_families=WANTED_FAMILIES)
            expo = result.exposition
            expo.timestamp = result.timestamp
            if count == 0:
                ex = extract(expo, result.timestamp, name)
                if not ex.counters and not ex.gauges and not ex.unknown:
                    progress.clear()
                    raise InputError(
                        f"{url}: no vLLM metrics in its {result.payload_bytes:,}-byte body "
                        "(is this vLLM's /metrics? is --disable-log-stats set?)"
                    )
            for i, (sample_name, labels, value, ts) in enumerate(expo.samples):
                expo.samples[i] = (sample_name, {**labels, "instance": name}, value, ts)
            count += 1
            left = max(deadline - time.monotonic(), 0.0)
            progress.update(
                f"analyze --target: {count} scrape(s) of {name}, {format_seconds(left)} left"
            )
            yield expo
            if started + interval > deadline:
                return
            time.sleep(max(0.0, started + interval - time.monotonic()))
        progress.finish(f"analyze --target: {count} scrape(s) of {name}")
    finally:
        scraper.close()


@cli.command(epilog=docs_epilog("rules.md", "runbooks.md"))
@click.option(
    "--out",
    "out_dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory receiving alerts/ and dashboards/.",
)
@click.option(
    "--selector",
    default=None,
    metavar="MATCHERS",
    help='PromQL matchers of the vLLM targets (default: job="vllm").',
)
@click.option(
    "--sidecar-selector",
    default=None,
    metavar="MATCHERS",
    help='PromQL matchers of the kvoffload sidecar (default: job="kvoffload").',
)
@click.option("--rate-window", default=None, help="Window of the fast figures (default: 5m).")
@click.option(
    "--slow-window",
    default=None,
    help="Window of reuse, waste, fill time and the transfer alerts (default: 1h).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other setting of the docs' rules.md (below), e.g. low_reuse_ratio=0.1 or "
    "alert_for.KVOffloadTransferSlow=1h; repeatable.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 when a generated file is missing or differs.",
)
def generate(
    out_dir: str,
    selector: str | None,
    sidecar_selector: str | None,
    rate_window: str | None,
    slow_window: str | None,
    settings: tuple[str, ...],
    check: bool,
) -> None:
    """Write the Prometheus rules and Grafana dashboards for your labels and thresholds."""
    from kvoffload.mixin import generate as gen

    overrides = gen.parse_overrides(settings)
    for key, value in (
        ("sidecar_selector", sidecar_selector),
        ("rate_window", rate_window),
        ("slow_window", slow_window),
    ):
        if value is not None:
            overrides[key] = value
    if check:
        stale = gen.check(out_dir, selector=selector, **overrides)
        for rel in stale:
            click.echo(f"stale: {rel}", err=True)
        if stale:
            sys.exit(1)
        return
    paths, checked = gen.generate_checked(out_dir, selector=selector, **overrides)
    for path in paths:
        click.echo(str(path))
    tool = (
        f"; {checked.rule_files} rule files by {checked.promtool} check rules"
        if checked.promtool
        else "; promtool not on PATH: rule files not checked by promtool"
    )
    click.echo(f"validated {checked.expressions} expressions with promql-parser{tool}", err=True)


def _scenario(name: str):
    from kvoffload.sim import scenarios

    try:
        return scenarios.get(name)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None


@cli.command(epilog=docs_epilog("scenarios.md"))
@click.option(
    "--scenario",
    default="laptop-eviction",
    show_default=True,
    help="A scenario of the library (docs: scenarios.md, below).",
)
@web_options("127.0.0.1:8000", "--listen")
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Simulated seconds per real second: the traffic is that much denser "
    "(per-second rates read that many times higher); TTFT, copy times and "
    "GB/s stay the simulated ones.",
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "virtual"]),
    default="wall",
    show_default=True,
    help="wall: samples without timestamps (Prometheus stamps them, at any speed), "
    "_created and KV event times on the real clock. virtual: the scenario's "
    "calendar, every sample stamped with it (a sidecar alone then sees "
    "simulated seconds; Prometheus drops such samples).",
)
@click.option(
    "--record",
    "record_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a recording instead of serving (no waiting: virtual clock).",
)
@click.option(
    "--duration",
    callback=_duration,
    default=None,
    help="With --record: virtual time to record (default: the scenario's length).",
)
@click.option(
    "--interval",
    callback=_duration,
    default="15s",
    show_default=True,
    help="With --record: scrape interval in virtual time.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--kv-events",
    "kv_events",
    metavar="ENDPOINT",
    default=None,
    help="Publish vLLM's KV cache events over ZMQ, e.g. tcp://127.0.0.1:5557 "
    "(bound; DP rank N on port + N).",
)
@click.option(
    "--kv-events-replay",
    metavar="ENDPOINT",
    default=None,
    help="With --kv-events: the replay (ROUTER) endpoint, e.g. tcp://127.0.0.1:5558.",
)
@click.option(
    "--record-kv-events",
    "record_kv_events",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --record: also write the KV event stream to this file.",
)
@click.option("--list", "list_scenarios", is_flag=True, help="List the scenarios and exit.")
def sim(
    scenario: str,
    web: WebFlags,
    speed: float,
    clock: str,
    record_path: str | None,
    duration: float | None,
    interval: float,
    seed: int,
    kv_events: str | None,
    kv_events_replay: str | None,
    record_kv_events: str | None,
    list_scenarios: bool,
) -> None:
    """Run the built-in vLLM simulator: serve /metrics until stopped (the scenario's traffic
    goes on past its length), or write a recording."""
    from kvoffload.sim import SimServer, scenarios

    if list_scenarios:
        for name in scenarios.names():
            sc = scenarios.get(name)
            click.echo(f"{name:28} {sc.description.splitlines()[0] if sc.description else ''}")
        return
    chosen = _scenario(scenario)
    if kv_events_replay is not None and kv_events is None:
        raise InputError("--kv-events-replay needs --kv-events")
    if record_kv_events is not None and record_path is None:
        raise InputError("--record-kv-events needs --record")
    if record_path is not None:
        from kvoffload.sim.write_recording import record_scenario

        if kv_events is not None:
            raise InputError("--kv-events serves; with --record use --record-kv-events")
        n = record_scenario(
            chosen,
            record_path,
            duration or chosen.duration_s,
            interval,
            seed=seed,
            events_path=record_kv_events,
        )
        click.echo(
            f"wrote {n} scrapes of {chosen.name} to {record_path}"
            + (f" and its KV events to {record_kv_events}" if record_kv_events else ""),
            err=True,
        )
        return
    from kvoffload.sim.server import make_app as make_sim_app

    log = logging.getLogger("kvoffload.sim")
    if kv_events is not None:
        replay = f" (replay {kv_events_replay})" if kv_events_replay else ""
        log.info("KV events: %s%s", kv_events, replay)
    # A server runs until stopped: the workload continues period after period (no counter
    # reset, memory capped) so a sidecar or Prometheus next to it never sees it go idle.
    wall = SimServer.wall_clock(speed) if clock == "wall" else {}
    app = make_sim_app(
        SimServer(chosen, seed=seed, kv_events=kv_events is not None, endless=True, **wall),
        speed=speed,
        kv_events_endpoint=kv_events,
        kv_events_replay=kv_events_replay,
        metrics_path=web.telemetry_path,
    )
    run_app(app, web, lambda url: log.info("simulated vLLM (%s, %gx): %s", chosen.name, speed, url))


@cli.command()
@click.option("--scenario", default="laptop-eviction", show_default=True)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Virtual seconds per real second.",
)
@click.option(
    "--duration",
    callback=_duration,
    default=None,
    help="Stop after this long (default: until Ctrl-C).",
)
@web_options("127.0.0.1:0")
@click.option(
    "--every",
    callback=_duration,
    default="3s",
    show_default=True,
    help="How often to print the summary.",
)
@click.option(
    "--kv-events/--no-kv-events",
    default=True,
    show_default=True,
    help="Also publish and subscribe to KV events (the exact miss-ratio curve).",
)
@click.option(
    "--memory-limit",
    callback=_size,
    default=None,
    help="The simulated vLLM container's memory limit, for the OOM check (e.g. 16Gi).",
)
def demo(
    scenario: str,
    speed: float,
    duration: float | None,
    web: WebFlags,
    every: float,
    kv_events: bool,
    memory_limit: float | None,
) -> None:
    """The simulator and the sidecar together, with a live summary (the quick start); the
    sidecar at --web.listen-address (port 0: a free one), the simulator on a free port."""
    import asyncio

    from kvoffload.cli.demo import run_demo
    from kvoffload.sidecar.webconfig import WebSecurity

    _scenario(scenario)
    security = WebSecurity(web.config_file)
    try:
        asyncio.run(
            run_demo(
                scenario,
                speed,
                duration,
                web.host,
                web.port,
                every,
                click.echo,
                kv_events,
                metrics_path=web.telemetry_path,
                security=security,
                memory_limit=memory_limit,
            )
        )
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


def _serve_env(flag: str) -> list[str]:
    """healthcheck reads the variables `serve` does (the container sets them for serve)."""
    return [f"KVOFFLOAD_HEALTHCHECK_{flag}", f"KVOFFLOAD_SERVE_{flag}", f"KVOFFLOAD_{flag}"]


@cli.command()
@click.option(
    "--web.listen-address",
    "listen",
    default=f"0.0.0.0:{DEFAULT_PORT}",
    show_default=True,
    envvar=_serve_env("WEB_LISTEN_ADDRESS"),
    help="The address `serve` listens on.",
)
@click.option(
    "--web.config.file",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar=_serve_env("WEB_CONFIG_FILE"),
    help="`serve`'s web config: with TLS in it the check speaks https.",
)
@click.option("--timeout", callback=_duration, default="4s", show_default=True)
def healthcheck(listen: str, config_file: str | None, timeout: float) -> None:
    """Exit 0 when the sidecar on this host answers /healthz, else 1 (a container's
    HEALTHCHECK): the address and scheme `serve` uses, from the same flags and variables."""
    import ssl
    import urllib.error
    import urllib.request

    from kvoffload.cli.flags import parse_listen
    from kvoffload.sidecar.webconfig import parse_web_config

    host, port = parse_listen(listen)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    tls = config_file is not None and parse_web_config(config_file).tls
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if tls else 'http'}://{shown}:{port}/healthz"
    context = None
    if tls:
        # A liveness probe of our own loopback listener: its certificate names a service,
        # not 127.0.0.1, so it is not verified here.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            ok = answer.status == 200
    except (OSError, urllib.error.URLError) as exc:
        click.echo(f"kvoffload: healthcheck: {url}: {exc}", err=True)
        sys.exit(1)
    if not ok:
        click.echo(f"kvoffload: healthcheck: {url}: HTTP {answer.status}", err=True)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="kvoffload", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_BAD_INPUT if exc.exit_code == 2 else exc.exit_code)
    except InputError as exc:
        click.echo(f"kvoffload: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
