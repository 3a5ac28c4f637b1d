"""The sidecar's own /metrics: fresh const metrics built from the latest analysis per scrape."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from kvoffload import __version__
from kvoffload.analysis.advisor import ACTIONS, GIB, Recommendation
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.signals import FIGURES, PER_TIER_FIGURES, per_tier_metric
from kvoffload.sidecar.service import Service, TargetState

GROUP = ("target", "model_name")  # the labels of every per-group series
GROUP_LABELS = list(GROUP)


class Series(NamedTuple):
    """One of the sidecar's own series: what /metrics exposes and docs/metrics.md lists."""

    section: str  # the docs' table it sits in, and the collector that fills it
    name: str
    type: str  # gauge, counter or histogram
    labels: tuple[str, ...]
    help: str


# Every series the sidecar exposes besides the figures (analysis.signals.FIGURES) and the
# process collectors: one row each, in the order docs/metrics.md lists them.
SERIES: tuple[Series, ...] = (
    # per target: scrapes and what they could not read
    Series(
        "target",
        "kvoffload_build_info",
        "gauge",
        ("version",),
        "kvoffload version (always 1).",
    ),
    Series(
        "target",
        "kvoffload_up",
        "gauge",
        ("target",),
        "1 if the last scrape of the vLLM target succeeded and parsed, else 0.",
    ),
    Series(
        "target",
        "kvoffload_scrape_duration_seconds",
        "gauge",
        ("target",),
        "Duration of the last successful scrape of the target, fetch to updated figures.",
    ),
    Series(
        "target",
        "kvoffload_scrape_failures",
        "counter",
        ("target",),
        "Scrapes of the target that failed (unreachable, slow, HTTP error, oversized or "
        "unparsable).",
    ),
    Series(
        "target",
        "kvoffload_samples_rejected",
        "counter",
        (
            "target",
            "reason",
        ),
        "Samples of the target not believed, read as unknown: the figures that read them are "
        "absent while that scrape is in the window (reason=timestamp: NaN, infinite or over a "
        "year from the scrape; reason=value: NaN, infinite or beyond ±1e30; reason=range: "
        "outside the range of its catalog row, such as a negative counter or a KV-cache usage "
        "outside [0, 1]).",
    ),
    Series(
        "target",
        "kvoffload_scrape_limit_exceeded",
        "counter",
        (
            "target",
            "limit",
        ),
        "Scrapes of the target failed for going over a limit (limit=samples: "
        "--scrape.sample-limit; groups: --scrape.group-limit; label_value_length: "
        "--scrape.label-value-length-limit). Also counted in kvoffload_scrape_failures_total.",
    ),
    Series(
        "target",
        "kvoffload_counter_resets",
        "counter",
        (
            "target",
            "reason",
        ),
        "Counter series of the target seen to reset, each taken from zero as increase() does "
        "(reason=restart: its _created moved, or its engine's counters went down together; "
        "reason=decrease: it went down while its engine did not restart, and the figures that "
        "read it are absent while that scrape is in the window).",
    ),
    Series(
        "target",
        "kvoffload_scrape_payload_bytes",
        "gauge",
        ("target",),
        "Size of the target's last /metrics body.",
    ),
    Series(
        "target",
        "kvoffload_last_success_timestamp_seconds",
        "gauge",
        ("target",),
        "Unix time of the target's last successful scrape.",
    ),
    Series(
        "target",
        "kvoffload_offloading_enabled",
        "gauge",
        GROUP,
        "1 if the engine exposes KV offloading metrics.",
    ),
    Series(
        "target",
        "kvoffload_window_seconds",
        "gauge",
        GROUP,
        "Time span the figures of this group cover.",
    ),
    # per group: the published advice
    Series(
        "advice",
        "kvoffload_recommendation",
        "gauge",
        (
            *GROUP,
            "action",
        ),
        "Current advice: 1 for the recommended action (enable, leave_off, keep, grow, shrink, "
        "store_threshold, disable), 0 for the others.",
    ),
    Series(
        "advice",
        "kvoffload_recommended_size_bytes",
        "gauge",
        GROUP,
        "Recommended --kv-offloading-size in bytes, when the advice carries a size.",
    ),
    Series(
        "advice",
        "kvoffload_recommendation_since_timestamp_seconds",
        "gauge",
        GROUP,
        "Data time (scrape timestamp) since which the published advice has stood; absent "
        "while the first minutes after a start or a tier change are not judged.",
    ),
    Series(
        "advice",
        "kvoffload_recommendation_pending",
        "gauge",
        (
            *GROUP,
            "action",
        ),
        "1 for a new advice that has not yet held for the dwell time (the published one "
        "stands meanwhile).",
    ),
    Series(
        "advice",
        "kvoffload_recommended_store_threshold",
        "gauge",
        GROUP,
        "Recommended store_threshold for kv_connector_extra_config (store a block from its "
        "N-th sighting), when the advice sets one from the exact what-if (analysis.knobs).",
    ),
    Series(
        "advice",
        "kvoffload_recommended_eviction_policy",
        "gauge",
        (
            *GROUP,
            "policy",
        ),
        "1 for the eviction_policy the advice sets in kv_connector_extra_config (arc, where "
        "ARC's what-if hit ratio beats LRU's by the margin without losing TTFT).",
    ),
    # per group: the TTFT verdict (analysis.ttft); negative = faster, bound=estimate|low|high
    Series(
        "ttft",
        "kvoffload_offload_ttft_effect_seconds",
        "gauge",
        (
            *GROUP,
            "bound",
        ),
        "Mean TTFT change per request that the CPU tier causes now versus no offloading "
        "(negative = faster), measured on this server; bound=estimate|low|high.",
    ),
    Series(
        "ttft",
        "kvoffload_recommended_ttft_change_seconds",
        "gauge",
        (
            *GROUP,
            "basis",
            "bound",
        ),
        "Predicted mean TTFT change per request if the recommendation is applied, relative to "
        "now (negative = faster); basis=measured|predicted|replicas|before_after, "
        "bound=estimate|low|high.",
    ),
    Series(
        "ttft",
        "kvoffload_predicted_offload_ttft_effect_seconds",
        "gauge",
        GROUP,
        "Predicted mean TTFT change per request of a CPU tier at the recommended size versus "
        "none (negative = faster), from the KV-event curve.",
    ),
    Series(
        "ttft",
        "kvoffload_marginal_recompute_ttft_seconds",
        "gauge",
        GROUP,
        "Mean TTFT (summed over requests) that one more recomputed prompt token costs, fitted "
        "over scrape intervals.",
    ),
    # KV events (kvoffload.kvevents)
    Series(
        "kv_events",
        "kvoffload_kv_events_messages",
        "counter",
        ("target",),
        "KV-event messages received from vLLM.",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_lost_messages",
        "counter",
        ("target",),
        "KV-event messages lost (sequence gaps not replayed).",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_decode_errors",
        "counter",
        ("target",),
        "KV-event payloads that did not decode.",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_evicted_blocks",
        "counter",
        (
            "target",
            "state",
        ),
        "Blocks the KV-event state forgot to stay within --kv-events-sample-budget, by "
        "structure (gpu_parents: the GPU prefix map, cpu_resident: the CPU tier's residency): "
        "a publisher storing blocks it never removes.",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_sequence_anomalies",
        "counter",
        (
            "target",
            "reason",
        ),
        "KV-event messages with an implausible sequence number: rejected (out of range, not "
        "taken) or jump (a forward gap no publisher could have made: not counted as lost).",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_publisher_restarts",
        "counter",
        ("target",),
        "KV-event publishers seen to restart (the sequence went back: vLLM restarted); what "
        "of its history was not replayed shows in kvoffload_kv_events_unseen_messages.",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_refused_events",
        "counter",
        (
            "target",
            "reason",
        ),
        "KV events not taken, by reason (block_size: a BlockStored whose block_size is "
        "negative or over 2^20 tokens).",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_unseen_messages",
        "gauge",
        ("target",),
        "KV-event messages vLLM published before the sidecar listened and no longer holds for "
        "replay: history the curve does not contain (0 = complete).",
    ),
    # per group: the exact what-ifs of store_threshold and the eviction policy (kvevents.whatif)
    Series(
        "whatif",
        "kvoffload_whatif_stored_bytes",
        "gauge",
        (
            *GROUP,
            "tier",
            "store_threshold",
        ),
        "Bytes a CPU tier would have stored over the KV events with store_threshold N (LRU), "
        "replayed exactly; tier=current|advised names its size.",
    ),
    Series(
        "whatif",
        "kvoffload_whatif_never_reloaded_bytes",
        "gauge",
        (
            *GROUP,
            "tier",
            "store_threshold",
        ),
        "Of kvoffload_whatif_stored_bytes, the bytes never loaded back (evicted or still "
        "resident unread): PCIe and pinned memory spent for nothing.",
    ),
    Series(
        "whatif",
        "kvoffload_whatif_offload_hit_ratio",
        "gauge",
        (
            *GROUP,
            "tier",
            "store_threshold",
            "policy",
        ),
        "Share of GPU-missed prompt tokens the tier would have loaded, per store_threshold "
        "(policy=lru) and per eviction policy (store_threshold=1), replayed exactly.",
    ),
    Series(
        "whatif",
        "kvoffload_whatif_tiered_offload_hit_ratio",
        "gauge",
        (*GROUP, "tier"),
        "Share of GPU-missed prompt tokens the CPU tier would have loaded with a file-system tier "
        "under it (vLLM's: written through, never evicting), replayed exactly (LRU).",
    ),
    Series(
        "whatif",
        "kvoffload_whatif_secondary_tier_hit_ratio",
        "gauge",
        (*GROUP, "tier"),
        "Of kvoffload_whatif_tiered_offload_hit_ratio, the share found only in the tier below "
        "and promoted: what that tier would add.",
    ),
    Series(
        "kv_events",
        "kvoffload_curve_provisional",
        "gauge",
        GROUP,
        "1 while the KV-event curve cannot size a tier yet (a partial stream, too short, or "
        "still warming up from a cold start: the reasons are in the JSON and the advice), "
        "else 0.",
    ),
    Series(
        "kv_events",
        "kvoffload_kv_events_sample_ratio",
        "gauge",
        ("target",),
        "Share of blocks tracked for reuse distances (1 = exact).",
    ),
    Series(
        "kv_events",
        "kvoffload_reuse_distance_bytes",
        "histogram",
        GROUP,
        "GPU-missed prompt tokens by LRU reuse distance in bytes (KV events): the bucket at "
        "le=C counts the tokens a CPU tier of C bytes per engine would have served.",
    ),
    Series(
        "kv_events",
        "kvoffload_cpu_resident_bytes",
        "gauge",
        GROUP,
        "Bytes resident in the CPU tier (KV events).",
    ),
    Series(
        "kv_events",
        "kvoffload_never_loaded_evicted_bytes",
        "counter",
        GROUP,
        "Bytes stored into the CPU tier and evicted without ever being loaded (KV events).",
    ),
    Series(
        "kv_events",
        "kvoffload_secondary_tier_stored_bytes",
        "counter",
        GROUP,
        "Bytes the tiers below the CPU tier report stored (KV events: vLLM's fs tier with "
        "enable_kv_events in its secondary_tiers entry).",
    ),
    Series(
        "kv_events",
        "kvoffload_never_loaded_resident_bytes",
        "gauge",
        GROUP,
        "Bytes in the CPU tier not loaded since they were stored (KV events).",
    ),
    Series(
        "kv_events",
        "kvoffload_achievable_offload_hit_ratio",
        "gauge",
        GROUP,
        "Offload hit ratio an unbounded CPU tier would reach (KV events).",
    ),
    Series(
        "kv_events",
        "kvoffload_predicted_offload_hit_ratio",
        "gauge",
        GROUP,
        "Predicted offload hit ratio at the recommended (else the current) CPU tier size; at "
        "the current size on a server with a tier below the CPU tier, with that tier's hits.",
    ),
    # `serve --prometheus`: the reads of the fleet from Prometheus
    Series(
        "fleet",
        "kvoffload_fleet_reads",
        "counter",
        (),
        "Reads of the fleet's vLLM series from Prometheus (serve --prometheus).",
    ),
    Series(
        "fleet",
        "kvoffload_fleet_read_failures",
        "counter",
        (),
        "Reads of the fleet from Prometheus that failed as a whole (unreachable, error, no "
        "vLLM series in the range): the last good analysis stays published, every target "
        "down.",
    ),
    Series(
        "fleet",
        "kvoffload_fleet_read_duration_seconds",
        "gauge",
        (),
        "Duration of the last successful read of the fleet, first question to updated analysis.",
    ),
    # vLLM's container memory (ingest.hostmemory): "will it OOM?" as numbers
    Series(
        "host_memory",
        "kvoffload_host_memory_usage_bytes",
        "gauge",
        (),
        "Memory of vLLM's container as its cgroup counts it (memory.current; v1: "
        "usage_in_bytes), page cache included.",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_unreclaimable_bytes",
        "gauge",
        (),
        "Memory of vLLM's container the kernel cannot reclaim: anonymous + shared memory, the "
        "pinned CPU tier included. What the OOM killer weighs against the limit.",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_shmem_bytes",
        "gauge",
        (),
        "Shared memory of vLLM's container (vLLM 0.26.0's pinned tier lives there).",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_limit_bytes",
        "gauge",
        (),
        "Memory limit of vLLM's container (--memory-limit, else its cgroup's); absent when "
        "unlimited.",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_oom_kills",
        "counter",
        (),
        "Processes of vLLM's container the kernel OOM-killed (memory.events oom_kill).",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_vllm_pss_bytes",
        "gauge",
        ("type",),
        "Proportional set size of vLLM's processes, where this process can see them "
        "(type=anon, shmem, file).",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_tier_footprint_bytes",
        "gauge",
        ("basis",),
        "Host memory the configured CPU tier takes (basis=measured: the shared memory shows "
        "it; basis=bound: 2x the configured size, what torch's power-of-two pinned "
        "allocations can take at most).",
    ),
    Series(
        "host_memory",
        "kvoffload_host_memory_read_info",
        "gauge",
        (
            "source",
            "problem",
        ),
        "How vLLM's container memory was found (source=pod, vllm-processes, explicit, none, "
        "off) and what kept it from being read (problem; empty when read). Always 1.",
    ),
)
# Per secondary tier, the tier figures again (analysis.signals.per_tier_figures), unit as exported.
SERIES += tuple(
    Series(
        "tiers",
        per_tier_metric(fig),
        "gauge",
        (*GROUP, "tier"),
        'Of one secondary tier (tier="<position>:<type>", e.g. "1:fs"): '
        + fig.help.replace(", all secondary tiers together", ""),
    )
    for fig in PER_TIER_FIGURES
)
SERIES_BY_NAME = {row.name: row for row in SERIES}


def _section(section: str) -> dict[str, tuple[str, list[str], str]]:
    """A section's rows as name → (type, labels, help), the shape the docs and panels read."""
    return {r.name: (r.type, list(r.labels), r.help) for r in SERIES if r.section == section}


TARGET_METRICS = _section("target")
ADVICE_METRICS = _section("advice")
KV_EVENT_METRICS = _section("kv_events")
WHATIF_METRICS = _section("whatif")
TIER_METRICS = _section("tiers")
FLEET_METRICS = _section("fleet")
HOST_MEMORY_METRICS = _section("host_memory")
# The TTFT verdict's gauges as name → (labels beyond the group's, help).
TTFT_METRICS: dict[str, tuple[list[str], str]] = {
    r.name: (list(r.labels[len(GROUP) :]), r.help) for r in SERIES if r.section == "ttft"
}


def _spec(name: str, mtype: str) -> tuple[list[str], str]:
    row = SERIES_BY_NAME[name]
    assert row.type == mtype, name
    return list(row.labels), row.help


def _gauge(name: str) -> GaugeMetricFamily:
    labels, help_text = _spec(name, "gauge")
    return GaugeMetricFamily(name, help_text, labels=labels)


def _counter(name: str) -> CounterMetricFamily:
    labels, help_text = _spec(name, "counter")
    return CounterMetricFamily(name, help_text, labels=labels)


def _histogram(name: str) -> HistogramMetricFamily:
    labels, help_text = _spec(name, "histogram")
    return HistogramMetricFamily(name, help_text, labels=labels)


@runtime_checkable
class ReadsFromPrometheus(Protocol):
    """A service that reads its figures from Prometheus (`fleet.service`), counting its reads.

    A protocol, so this module (below `fleet/`) never imports the fleet."""

    reads: int
    failures: int

    @property
    def last_read_seconds(self) -> float | None: ...


class SidecarCollector(Collector):
    def __init__(self, sidecar: Service) -> None:
        self.sidecar = sidecar

    def collect(self) -> Iterator[Metric]:
        sc = self.sidecar
        build = _gauge("kvoffload_build_info")
        build.add_metric([__version__], 1)
        yield build
        if isinstance(sc, ReadsFromPrometheus):
            yield from _fleet_reads(sc)
        yield from _scrape_health(sc.targets)
        groups = sc.groups()
        yield from _group_figures(groups)
        yield from self._kv_events(groups)
        yield from _whatif(groups)
        yield from _per_tier(groups)

    def _kv_events(self, groups: list[GroupAnalysis]) -> Iterator[Metric]:
        sc = self.sidecar
        if not sc.events:
            return
        messages = _counter("kvoffload_kv_events_messages")
        lost = _counter("kvoffload_kv_events_lost_messages")
        errors = _counter("kvoffload_kv_events_decode_errors")
        unseen = _gauge("kvoffload_kv_events_unseen_messages")
        rate = _gauge("kvoffload_kv_events_sample_ratio")
        evicted = _counter("kvoffload_kv_events_evicted_blocks")
        anomalies = _counter("kvoffload_kv_events_sequence_anomalies")
        restarts = _counter("kvoffload_kv_events_publisher_restarts")
        refused = _counter("kvoffload_kv_events_refused_events")
        for name, state in sc.events.items():
            restarts.add_metric([name], state.publisher_restarts())
            for reason, count in state.refused_events().items():
                refused.add_metric([name, reason], count)
            for kind, count in state.evicted_blocks().items():
                evicted.add_metric([name, kind], count)
            for reason, count in state.sequence_anomalies().items():
                anomalies.add_metric([name, reason], count)
            messages.add_metric([name], state.messages())
            lost.add_metric([name], state.lost_messages())
            errors.add_metric([name], state.decode_errors)
            unseen.add_metric([name], state.unseen_before_start())
            rate.add_metric([name], state.sample_rate_now())
        yield from (messages, lost, errors, unseen, rate, evicted, anomalies, restarts, refused)

        hist = _histogram("kvoffload_reuse_distance_bytes")
        resident = _gauge("kvoffload_cpu_resident_bytes")
        never_evicted = _counter("kvoffload_never_loaded_evicted_bytes")
        never_resident = _gauge("kvoffload_never_loaded_resident_bytes")
        tier_stored = _counter("kvoffload_secondary_tier_stored_bytes")
        achievable = _gauge("kvoffload_achievable_offload_hit_ratio")
        predicted = _gauge("kvoffload_predicted_offload_hit_ratio")
        provisional = _gauge("kvoffload_curve_provisional")
        for g in groups:
            info = g.kv_events
            if g.stale or info is None:
                continue
            key = [g.instance, g.model_name]
            if g.reuse_histogram is not None:
                hist.add_metric(
                    key,
                    [(_le(le), tokens) for le, tokens in g.reuse_histogram.buckets],
                    g.reuse_histogram.sum_bytes,
                )
            pairs: tuple[tuple[GaugeMetricFamily | CounterMetricFamily, str], ...] = (
                (resident, "cpu_resident_bytes"),
                (never_evicted, "never_loaded_evicted_bytes"),
                (never_resident, "never_loaded_resident_bytes"),
                (achievable, "achievable_hit_ratio"),
            )
            for family, field_name in pairs:
                value = info.get(field_name)
                if isinstance(value, float | int):
                    family.add_metric(key, float(value))
            # only where a tier below reports stores: a 0 would suggest one on every server
            if isinstance(value := info.get("tier_stored_bytes"), float | int) and value > 0:
                tier_stored.add_metric(key, float(value))
            if g.predicted_offload_hit_ratio is not None:
                predicted.add_metric(key, g.predicted_offload_hit_ratio)
            if "provisional" in info:
                provisional.add_metric(key, float(bool(info["provisional"])))
        yield from (
            hist,
            resident,
            never_evicted,
            never_resident,
            tier_stored,
            achievable,
            predicted,
            provisional,
        )


def _scrape_health(targets: list[TargetState]) -> Iterator[Metric]:
    """Each target's scrapes: up, duration, size, failures and what they could not read.

    Why: a figure is only as good as the scrapes behind it, so these come first on /metrics.
    """
    up = _gauge("kvoffload_up")
    duration = _gauge("kvoffload_scrape_duration_seconds")
    failures = _counter("kvoffload_scrape_failures")
    payload = _gauge("kvoffload_scrape_payload_bytes")
    last_ok = _gauge("kvoffload_last_success_timestamp_seconds")
    rejected = _counter("kvoffload_samples_rejected")
    over_limit = _counter("kvoffload_scrape_limit_exceeded")
    resets = _counter("kvoffload_counter_resets")
    for t in targets:
        up.add_metric([t.name], 1.0 if t.up else 0.0)
        failures.add_metric([t.name], t.failures)
        if t.last_duration_seconds is not None:
            duration.add_metric([t.name], t.last_duration_seconds)
            payload.add_metric([t.name], t.payload_bytes)
        if t.last_success_timestamp is not None:
            last_ok.add_metric([t.name], t.last_success_timestamp)
        for reason, count in sorted(t.rejected.items()):
            rejected.add_metric([t.name, reason], count)
        for limit, count in sorted(t.limit_exceeded.items()):
            over_limit.add_metric([t.name, limit], count)
        for reason, count in sorted(t.counter_resets.items()):
            resets.add_metric([t.name, reason], count)
    yield from (up, duration, failures, payload, last_ok, rejected, over_limit, resets)


def _group_figures(groups: list[GroupAnalysis]) -> Iterator[Metric]:
    """Each live group's window, figures, advice and TTFT verdict.

    Why: a stale group (its target down) is left out, since its old figures would lie.
    """
    offloading = _gauge("kvoffload_offloading_enabled")
    window = _gauge("kvoffload_window_seconds")
    figures, advice, verdict = _FigureFamilies(), _AdviceFamilies(), _TtftFamilies()
    for g in groups:
        if g.stale:
            continue  # its target is down: kvoffload_up says so, old figures would lie
        key = [g.instance, g.model_name]
        offloading.add_metric(key, 1.0 if g.offloading else 0.0)
        window.add_metric(key, g.window_seconds)
        figures.add(key, g)
        advice.add(key, g.recommendation)
        verdict.add(key, g)
    yield offloading
    yield window
    yield from figures.families.values()
    yield from advice.families()
    yield from verdict.families.values()


class _FigureFamilies:
    """The windowed figures (analysis.signals.FIGURES) of every group, one gauge per metric.

    Why: several figures share a metric apart by their labels, so a family is made once each.
    """

    def __init__(self) -> None:
        self.families: dict[str, GaugeMetricFamily] = {}
        for fig in FIGURES:
            if fig.metric not in self.families:
                extra = [k for k, _ in fig.labels]
                self.families[fig.metric] = GaugeMetricFamily(
                    fig.metric,
                    fig.help + " (windowed, computed by the sidecar)",
                    labels=GROUP_LABELS + extra,
                )

    def add(self, key: list[str], group: GroupAnalysis) -> None:
        """Add the group's figures that have a value, in the metric's export unit."""
        for fig in FIGURES:
            value = group.figures.get(fig.key)
            if value is not None:
                self.families[fig.metric].add_metric(
                    key + [v for _, v in fig.labels], value * fig.export_scale
                )


class _AdviceFamilies:
    """The recommendation of every group: its action, size, age, pending change and knobs.

    Why: alerts and dashboards read the advice as series, one family per question they ask.
    """

    def __init__(self) -> None:
        self.action = _gauge("kvoffload_recommendation")
        self.size = _gauge("kvoffload_recommended_size_bytes")
        self.since = _gauge("kvoffload_recommendation_since_timestamp_seconds")
        self.pending = _gauge("kvoffload_recommendation_pending")
        self.store_threshold = _gauge("kvoffload_recommended_store_threshold")
        self.eviction = _gauge("kvoffload_recommended_eviction_policy")

    def add(self, key: list[str], recommendation: Recommendation) -> None:
        """Add one group's recommendation (an action is 1, the others 0)."""
        for action in ACTIONS:
            self.action.add_metric([*key, action], 1.0 if recommendation.action == action else 0.0)
        if recommendation.kv_offloading_size_gib is not None:
            self.size.add_metric(key, recommendation.kv_offloading_size_gib * GIB)
        if recommendation.since is not None:
            self.since.add_metric(key, recommendation.since)
        if recommendation.pending is not None:
            self.pending.add_metric([*key, str(recommendation.pending["action"])], 1.0)
        knobs = recommendation.kv_connector_extra_config or {}
        if isinstance(threshold := knobs.get("store_threshold"), int):
            self.store_threshold.add_metric(key, float(threshold))
        if "eviction_policy" in knobs:
            self.eviction.add_metric([*key, str(knobs["eviction_policy"])], 1.0)

    def families(self) -> tuple[GaugeMetricFamily, ...]:
        """The families in the order /metrics lists them."""
        return (
            self.action,
            self.size,
            self.since,
            self.pending,
            self.store_threshold,
            self.eviction,
        )


def _whatif(groups: list[GroupAnalysis]) -> Iterator[Metric]:
    """The what-if rows of each group at its named tier sizes.

    They are GroupAnalysis.kv_events["whatif"], built by kvevents/whatif.py."""
    stored = _gauge("kvoffload_whatif_stored_bytes")
    never = _gauge("kvoffload_whatif_never_reloaded_bytes")
    hit = _gauge("kvoffload_whatif_offload_hit_ratio")
    tiered = _gauge("kvoffload_whatif_tiered_offload_hit_ratio")
    below = _gauge("kvoffload_whatif_secondary_tier_hit_ratio")
    seen: set[tuple[str, ...]] = set()
    for g in groups:
        whatif = (g.kv_events or {}).get("whatif")
        if g.stale or not isinstance(whatif, dict):
            continue
        key = [g.instance, g.model_name]
        for row in _rows(whatif, "store_threshold"):
            labels = [*key, str(row.get("size")), str(row.get("store_threshold"))]
            for family, field_name in (
                (stored, "stored_bytes"),
                (never, "stored_never_loaded_bytes"),
            ):
                if isinstance(value := row.get(field_name), float | int):
                    family.add_metric(labels, float(value))
            if isinstance(value := row.get("cpu_hit_ratio"), float | int):
                seen.add((*labels, "lru"))
                hit.add_metric([*labels, "lru"], float(value))
        for row in _rows(whatif, "eviction"):
            labels = [*key, str(row.get("size")), "1", str(row.get("policy"))]
            value = row.get("cpu_hit_ratio")
            if row.get("size") and isinstance(value, float | int) and tuple(labels) not in seen:
                hit.add_metric(labels, float(value))
        for row in _rows(whatif, "secondary_tier"):
            for family, field_name in ((tiered, "cpu_hit_ratio"), (below, "tier_hit_ratio")):
                if isinstance(value := row.get(field_name), float | int):
                    family.add_metric([*key, str(row.get("size"))], float(value))
    yield from (stored, never, hit, tiered, below)


def _per_tier(groups: list[GroupAnalysis]) -> Iterator[Metric]:
    """Each live group's secondary tiers apart, one gauge per tier figure."""
    families = {fig.key: _gauge(per_tier_metric(fig)) for fig in PER_TIER_FIGURES}
    for g in groups:
        if g.stale or not g.tiers:
            continue
        for tier, figures in g.tiers.items():
            for fig in PER_TIER_FIGURES:
                if (value := figures.get(fig.key)) is not None:
                    families[fig.key].add_metric(
                        [g.instance, g.model_name, tier], value * fig.export_scale
                    )
    yield from families.values()


def _rows(whatif: dict[object, object], kind: str) -> list[dict[str, object]]:
    rows = whatif.get(kind)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _fleet_reads(fleet: ReadsFromPrometheus) -> Iterator[Metric]:
    reads = _counter("kvoffload_fleet_reads")
    reads.add_metric([], fleet.reads)
    failures = _counter("kvoffload_fleet_read_failures")
    failures.add_metric([], fleet.failures)
    duration = _gauge("kvoffload_fleet_read_duration_seconds")
    if (seconds := fleet.last_read_seconds) is not None:
        duration.add_metric([], seconds)
    yield from (reads, failures, duration)


class HostMemoryCollector(Collector):
    """vLLM's container memory as the sidecar last read it (HOST_MEMORY_METRICS)."""

    def __init__(self, sidecar: Service) -> None:
        self.sidecar = sidecar

    def collect(self) -> Iterator[Metric]:
        sc = self.sidecar
        reading = sc.host_memory
        if reading is None:
            return
        info = _gauge("kvoffload_host_memory_read_info")
        info.add_metric([reading.source, reading.problem or ""], 1.0)
        yield info
        cg = reading.cgroup
        if cg is not None:
            yield _one("kvoffload_host_memory_usage_bytes", cg.usage_bytes)
            if "anon" in cg.stat:
                held = cg.stat["anon"] + cg.stat.get("shmem", 0.0)
                yield _one("kvoffload_host_memory_unreclaimable_bytes", held)
            if "shmem" in cg.stat:
                yield _one("kvoffload_host_memory_shmem_bytes", cg.stat["shmem"])
            if cg.oom_kills is not None:
                kills = _counter("kvoffload_host_memory_oom_kills")
                kills.add_metric([], cg.oom_kills)
                yield kills
        if reading.limit_bytes is not None:
            yield _one("kvoffload_host_memory_limit_bytes", reading.limit_bytes)
        procs = reading.processes
        if procs is not None:
            pss = _gauge("kvoffload_host_memory_vllm_pss_bytes")
            pss.add_metric(["anon"], procs.pss_anon_bytes)
            pss.add_metric(["shmem"], procs.pss_shmem_bytes)
            pss.add_metric(["file"], procs.pss_file_bytes)
            yield pss
        tier = sum(g.figures.get("cpu_capacity_bytes") or 0.0 for g in sc.groups() if g.offloading)
        if tier > 0:
            ratio, basis = reading.footprint_ratio(tier)
            footprint = _gauge("kvoffload_host_memory_tier_footprint_bytes")
            footprint.add_metric([basis], tier * ratio)
            yield footprint


def _one(name: str, value: float) -> GaugeMetricFamily:
    family = _gauge(name)
    family.add_metric([], value)
    return family


def _number(value: object) -> float:
    assert isinstance(value, float | int), value
    return float(value)


def _le(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


def build_registry(sidecar: Service) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(sidecar))
    registry.register(HostMemoryCollector(sidecar))
    # The self-metrics every exporter has (process_*: CPU, memory, open fds, start time;
    # python_*: version, GC), so the sidecar's own cost shows next to its figures.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class _TtftFamilies:
    """The TTFT verdict (kvoffload.analysis.ttft) of every group, as gauges (TTFT_METRICS)."""

    def __init__(self) -> None:
        self.families = {
            name: GaugeMetricFamily(name, help_text, labels=GROUP_LABELS + extra)
            for name, (extra, help_text) in TTFT_METRICS.items()
        }

    def _bounds(
        self, name: str, key: list[str], estimate: float, bounds: Sequence[float] | None
    ) -> None:
        """An effect and its range as bound=estimate|low|high (the range where there is one)."""
        self.families[name].add_metric([*key, "estimate"], float(estimate))
        if bounds is not None and len(bounds) == 2:
            for bound, value in zip(("low", "high"), bounds, strict=True):
                self.families[name].add_metric([*key, bound], float(value))

    def add(self, key: list[str], group: GroupAnalysis) -> None:
        verdict = group.ttft
        if verdict is not None and verdict.now is not None:
            self._bounds(
                "kvoffload_offload_ttft_effect_seconds",
                key,
                verdict.now.seconds,
                (verdict.now.low, verdict.now.high),
            )
        rec = group.recommendation
        if rec.ttft_change_seconds is not None:
            self._bounds(
                "kvoffload_recommended_ttft_change_seconds",
                [*key, str(rec.ttft_change_basis)],
                rec.ttft_change_seconds,
                rec.ttft_change_range_seconds,
            )
        if verdict is not None and verdict.predicted is not None:
            self.families["kvoffload_predicted_offload_ttft_effect_seconds"].add_metric(
                key, _number(verdict.predicted.seconds)
            )
        cost = verdict.marginal_recompute_seconds_per_token if verdict is not None else None
        if cost is not None:
            self.families["kvoffload_marginal_recompute_ttft_seconds"].add_metric(
                key, _number(cost.value)
            )
