"""The vLLM metric catalog: the samples we read, their legacy names, their believable range.

The catalog is rows of one shape (`Source`), like dcgm-exporter's default-counters.csv. Why:
everything downstream works on canonical keys, so the rest never sees vLLM's naming history
(docs/rules.md, "Conventions").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvoffload.ingest.parse import Exposition

# No count, size, time or ratio vLLM reports comes near this (a day at 10 GB/s is 1e15
# bytes); a value beyond it is garbage, and products of a few such values (a fit's squares,
# a rate × a size) stay within the float range, so nothing downstream overflows to inf.
# A sample outside its row's range is unknown (`Extract.unknown`, with a reason), never a figure.
MAX_VALUE = 1e30

# (sample name, required label, its value): a row as the PromQL renderings select it
Selector = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class Range:
    """The closed interval a believable value lies in (NaN lies in none)."""

    low: float
    high: float

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"[{self.low:.10g}, {self.high:.10g}]"


# The ranges the rows use. A counter only grows from zero; a count of requests is never
# negative; vLLM's KV-cache usage is a fraction (1 = full), not a percentage.
COUNT = Range(0.0, MAX_VALUE)
FRACTION = Range(0.0, 1.0)
BELIEVABLE = Range(-MAX_VALUE, MAX_VALUE)  # a `_created` time: only compared, never summed
TIB = 2.0**40
# A block of KV cache is at least a byte and far below a TiB (derived from the labels and
# figures: analysis.evidence); a block holds at most 2^20 tokens (kvevents.state's limit too).
BYTES_PER_BLOCK = Range(1.0, TIB)
BLOCK_TOKENS = Range(1.0, 2.0**20)


@dataclass(frozen=True)
class Source:
    """One row of the catalog.

    Its `kind` is "counter", "offload" (a transfer counter: `direction`, `naming`), "gauge" or
    "label". A gauge is `summed` over engines, else averaged; a label is numeric label `label` of
    `name`.
    """

    key: str
    kind: str
    name: str
    label: str | None = None  # the label a sample must have `value` for (kind "label": read)
    value: str | None = None
    range: Range = COUNT
    summed: bool = False
    direction: str | None = None
    naming: str | None = None  # "flat" | "legacy"
    # `value` is a regular expression (PromQL `=~`, anchored), and the samples a row matches
    # on one engine are added: a family with a `tier` label has one series per tier.
    regex: bool = False
    note: str | None = None  # where the series comes from (docs/metrics.md prints it)

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a sample with these labels is one this row reads."""
        if self.label is None:
            return True
        got = labels.get(self.label)
        if self.regex:
            return got is not None and re.fullmatch(self.value or "", got) is not None
        return got == self.value

    @property
    def selector(self) -> Selector:
        """(sample name, required label, its value): what the PromQL renderings read."""
        return (self.name, self.label, self.value)


CACHE_CONFIG_INFO = "vllm:cache_config_info"
OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"


def _counter(
    key: str, name: str, label: str | None = None, value: str | None = None, note: str | None = None
) -> Source:
    return Source(key, "counter", name, label, value, note=note)


# The CPU spec's newer series (vllm/v1/kv_offload/cpu/manager.py, its metric definitions).
CPU_NOTE = "CPU spec (cpu/manager.py); in the real vLLM 0.26 capture"
SKIPPED_NOTE = "CPU spec, only with store_threshold >= 2 (cpu/manager.py)"


# TieringOffloadingSpec labels every tiering series `tier="<position>:<type>"`: "0:primary" is
# the CPU tier, "1:fs", "2:obj", ... the secondary tiers below it, in lookup order
# (after vLLM 0.26.0, which has no per-tier series; PR #48798).
PRIMARY_TIER = "0:primary"
SECONDARY_TIERS = "[1-9][0-9]*:.+"
TIERING = "vllm:kv_offload_tiering_"


# Where the tiering names are defined, for docs/metrics.md. vLLM 0.26.0's TieringOffloadingSpec
# exports only the two lookup-delay histograms (TIERING_NOTE; the real capture in
# bench/real/results/qwen3-0.6b-rag-tiering-fs): the per-tier families came after it.
TIERING_NOTE = (
    "TieringOffloadingSpec, vllm/v1/kv_offload/tiering/spec.py; in the real vLLM 0.26 capture"
)
CHUNK_NOTE = (
    "TieringOffloadingMetrics, vllm/v1/kv_offload/tiering/base.py, after vLLM 0.26.0 (PR #48798; "
    "not in the real 0.26.0 capture; chunk spelling as llm-d-router #2397 reads it)"
)
BLOCK_NOTE = (
    "older spelling of PR #48798's first form, after vLLM 0.26.0 "
    "(read only where the chunk series are absent)"
)


def _tiering(
    key: str, name: str, tiers: str | None = SECONDARY_TIERS, note: str = CHUNK_NOTE
) -> Source:
    """A tiering counter, the series of every secondary tier (or the primary's) added."""
    if tiers is None:
        return Source(key, "counter", TIERING + name, regex=True, note=note)
    exact = tiers == PRIMARY_TIER
    return Source(key, "counter", TIERING + name, "tier", tiers, regex=not exact, note=note)


def _tier_gauge(key: str, name: str) -> Source:
    return Source(
        key,
        "gauge",
        TIERING + name,
        "tier",
        SECONDARY_TIERS,
        COUNT,
        True,
        regex=True,
        note=CHUNK_NOTE,
    )


def _offload(key: str, direction: str, flat: str, legacy: str, transfer: str) -> list[Source]:
    return [
        Source(key, "offload", flat, direction=direction, naming="flat"),
        Source(
            key, "offload", legacy, "transfer_type", transfer, COUNT, False, direction, "legacy"
        ),
    ]


CATALOG: tuple[Source, ...] = (
    _counter("prefix_queries", "vllm:prefix_cache_queries_total"),
    _counter("prefix_hits", "vllm:prefix_cache_hits_total"),
    _counter("ext_queries", "vllm:external_prefix_cache_queries_total"),
    _counter("ext_hits", "vllm:external_prefix_cache_hits_total"),
    _counter("prompt_tokens", "vllm:prompt_tokens_total"),
    _counter("src_local_compute", "vllm:prompt_tokens_by_source_total", "source", "local_compute"),
    _counter(
        "src_local_cache_hit", "vllm:prompt_tokens_by_source_total", "source", "local_cache_hit"
    ),
    _counter(
        "src_external", "vllm:prompt_tokens_by_source_total", "source", "external_kv_transfer"
    ),
    _counter("cached_host", "vllm:prompt_tokens_cached_by_source_total", "source", "host"),
    _counter("cached_disk", "vllm:prompt_tokens_cached_by_source_total", "source", "disk"),
    _counter("allocation_failures", "vllm:kv_offload_allocation_failure_total"),
    _counter("preemptions", "vllm:num_preemptions_total"),
    _counter("prefill_time_sum", "vllm:request_prefill_time_seconds_sum"),
    _counter("prefill_time_count", "vllm:request_prefill_time_seconds_count"),
    _counter("queue_time_sum", "vllm:request_queue_time_seconds_sum"),
    _counter("queue_time_count", "vllm:request_queue_time_seconds_count"),
    _counter("ttft_sum", "vllm:time_to_first_token_seconds_sum"),
    _counter("ttft_count", "vllm:time_to_first_token_seconds_count"),
    # Counted together at request finish, so one scrape interval holds a request's prefill
    # time with its computed tokens (the TTFT model's marginal cost: analysis.intervals).
    _counter("computed_tokens", "vllm:request_prefill_kv_computed_tokens_sum"),
    _counter("computed_count", "vllm:request_prefill_kv_computed_tokens_count"),
    _counter("e2e_sum", "vllm:e2e_request_latency_seconds_sum"),
    _counter("e2e_count", "vllm:e2e_request_latency_seconds_count"),
    # Engine steps and the tokens they ran: a step's length when the engine never idles.
    _counter("steps", "vllm:iteration_tokens_total_count"),
    _counter("step_tokens", "vllm:iteration_tokens_total_sum"),
    # Offload transfers: the flat series (≥0.24) and the deprecated transfer_type mirror, used
    # only when the flat family is absent, so the two are never added.
    *_offload(
        "load_bytes",
        "load",
        "vllm:kv_offload_load_bytes_total",
        "vllm:kv_offload_total_bytes_total",
        "CPU_to_GPU",
    ),
    *_offload(
        "load_time",
        "load",
        "vllm:kv_offload_load_time_total",
        "vllm:kv_offload_total_time_total",
        "CPU_to_GPU",
    ),
    *_offload(
        "load_jobs",
        "load",
        "vllm:kv_offload_load_size_count",
        "vllm:kv_offload_size_count",
        "CPU_to_GPU",
    ),
    *_offload(
        "store_bytes",
        "store",
        "vllm:kv_offload_store_bytes_total",
        "vllm:kv_offload_total_bytes_total",
        "GPU_to_CPU",
    ),
    *_offload(
        "store_time",
        "store",
        "vllm:kv_offload_store_time_total",
        "vllm:kv_offload_total_time_total",
        "GPU_to_CPU",
    ),
    # The newer CPU-spec series: stores skipped for want of reuse (store_threshold >= 2; the
    # family exists only then), the chunks each prepare_store asked for (0.26+), and the time
    # one lookup call takes (0.26+ as vllm:kv_offload_lookup_*, under the tiering spec too; its
    # vllm:kv_offload_tiering_lookup_* histograms measure per request, below).
    _counter("stores_skipped", "vllm:kv_offload_stores_skipped_total", note=SKIPPED_NOTE),
    _counter("alloc_size_sum", "vllm:kv_offload_cpu_allocation_size_sum", note=CPU_NOTE),
    _counter("alloc_size_count", "vllm:kv_offload_cpu_allocation_size_count", note=CPU_NOTE),
    _counter("lookup_sync_sum", "vllm:kv_offload_lookup_sync_delay_seconds_sum", note=CPU_NOTE),
    _counter("lookup_sync_count", "vllm:kv_offload_lookup_sync_delay_seconds_count", note=CPU_NOTE),
    # Secondary tiers (TieringOffloadingSpec, vllm/v1/kv_offload/tiering/, PR #48798): names
    # from TieringOffloadingMetrics. Lookups were counted as `block_{queries,hits}` in the
    # first releases with tiering metrics (tiering/ constants module of PR #48798) and as
    # `chunk_{queries,hits}` since (tiering/base.py; the rename is in the v0.24 -> v0.29
    # change notes; llm-d-router #2397 reads the chunk names): both are read, the chunk
    # spelling first. Lookups of the CPU tier itself are the tier="0:primary" series.
    _tiering("tier_chunk_queries", "chunk_queries_total"),
    _tiering("tier_chunk_hits", "chunk_hits_total"),
    _tiering("tier_block_queries", "block_queries_total", note=BLOCK_NOTE),
    _tiering("tier_block_hits", "block_hits_total", note=BLOCK_NOTE),
    _tiering("primary_chunk_queries", "chunk_queries_total", PRIMARY_TIER),
    _tiering("primary_chunk_hits", "chunk_hits_total", PRIMARY_TIER),
    _tiering("primary_block_queries", "block_queries_total", PRIMARY_TIER, BLOCK_NOTE),
    _tiering("primary_block_hits", "block_hits_total", PRIMARY_TIER, BLOCK_NOTE),
    # read = promotion (secondary -> CPU), write = cascade (CPU -> secondary).
    _tiering("tier_read_bytes", "read_bytes_total"),
    _tiering("tier_read_time", "read_time_total"),
    _tiering("tier_write_bytes", "write_bytes_total"),
    _tiering("tier_write_time", "write_time_total"),
    _tiering("tier_promotion_failures", "promotion_job_failures_total"),
    _tiering("tier_cascade_failures", "cascade_job_failures_total"),
    # No tier label: the CPU tier had no free slot for a promotion (the reload is dropped).
    _tiering("promotion_allocation_failures", "promotion_allocation_failures_total", None),
    # The tiering spec's two per-request histograms (vLLM 0.26.0: TieringOffloadingMetrics in
    # tiering/base.py, defined in tiering/spec.py; the only tiering series of the real 0.26.0
    # capture): the blocking time a request spent querying secondary tiers, and the wall-clock
    # wait from its first deferred secondary-tier lookup until it is scheduled.
    _tiering("tier_lookup_blocking_sum", "lookup_sync_delay_seconds_sum", None, TIERING_NOTE),
    _tiering("tier_lookup_blocking_count", "lookup_sync_delay_seconds_count", None, TIERING_NOTE),
    _tiering("tier_lookup_wait_sum", "lookup_async_delay_seconds_sum", None, TIERING_NOTE),
    _tiering("tier_lookup_wait_count", "lookup_async_delay_seconds_count", None, TIERING_NOTE),
    _tier_gauge("tier_active_promotions", "active_promotion_jobs"),
    _tier_gauge("tier_active_cascades", "active_cascade_jobs"),
    # Gauges: request counts are summed over engines, ratios averaged.
    Source("gpu_kv_usage", "gauge", "vllm:kv_cache_usage_perc", range=FRACTION),
    Source(
        "waiting_capacity",
        "gauge",
        "vllm:num_requests_waiting_by_reason",
        "reason",
        "capacity",
        summed=True,
    ),
    Source("running", "gauge", "vllm:num_requests_running", summed=True),
    # Numeric labels of the info metrics (read by analysis.signals and analysis.evidence).
    Source("block_size", "label", CACHE_CONFIG_INFO, "block_size", range=BLOCK_TOKENS),
    Source("num_gpu_blocks", "label", CACHE_CONFIG_INFO, "num_gpu_blocks"),
    Source("kv_cache_size_tokens", "label", CACHE_CONFIG_INFO, "kv_cache_size_tokens"),
    Source("kv_cache_memory_bytes", "label", CACHE_CONFIG_INFO, "kv_cache_memory_bytes"),
    Source("kv_offloading_size", "label", CACHE_CONFIG_INFO, "kv_offloading_size"),
    Source("cpu_kv_cache_size_bytes", "label", OFFLOAD_CONFIG_INFO, "cpu_kv_cache_size_bytes"),
    Source("cpu_kv_cache_size_tokens", "label", OFFLOAD_CONFIG_INFO, "cpu_kv_cache_size_tokens"),
    Source("cpu_num_chunks", "label", OFFLOAD_CONFIG_INFO, "cpu_num_chunks"),
    Source("cpu_blocks_per_chunk", "label", OFFLOAD_CONFIG_INFO, "cpu_blocks_per_chunk"),
)

# Views of the rows, by kind, for the readers and the PromQL renderings.
CORE_COUNTERS: dict[str, Selector] = {s.key: s.selector for s in CATALOG if s.kind == "counter"}
# Keys whose label value is a regular expression (rendered `=~`), their series added.
REGEX_KEYS = frozenset(s.key for s in CATALOG if s.regex)


def _offload_views() -> dict[str, tuple[str, Selector, Selector]]:
    """Offload transfer counter key → (direction, flat selector, legacy selector)."""
    rows = [s for s in CATALOG if s.kind == "offload"]
    legacy = {s.key: s.selector for s in rows if s.naming == "legacy"}
    return {
        s.key: (s.direction or "", s.selector, legacy[s.key]) for s in rows if s.naming == "flat"
    }


OFFLOAD_COUNTERS = _offload_views()
GAUGES: dict[str, Selector] = {s.key: s.selector for s in CATALOG if s.kind == "gauge"}
# Gauges that count requests are summed over engines; ratios are averaged.
SUMMED_GAUGES = frozenset(s.key for s in CATALOG if s.kind == "gauge" and s.summed)
GAUGE_KEYS: tuple[str, ...] = tuple(GAUGES)
# A numeric label's name → the range of a believable value of it.
LABEL_RANGES: dict[str, Range] = {
    s.label: s.range for s in CATALOG if s.kind == "label" and s.label is not None
}

# The flat family of each direction: declared, it is read and the legacy one is not.
FLAT_FAMILY = {
    "load": "vllm:kv_offload_load_bytes",
    "store": "vllm:kv_offload_store_bytes",
}
# The native OffloadingConnector, and SimpleCPUOffloadConnector (no bytes/time metrics).
OFFLOAD_FAMILY_PREFIXES = ("vllm:kv_offload_", "vllm:simple_kv_offload_")


def _created_name(sample_name: str) -> str:
    for suffix in ("_total", "_count", "_sum"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)] + "_created"
    return sample_name + "_created"


# How extract treats a sample: "counter", "flat"/"legacy" (offload, by naming), "gauge",
# "created_" + one of the counter kinds (its `_created`), "cache_config", "offload_config".
_Entry = tuple[str, Source | None]


def _build_index() -> dict[str, list[_Entry]]:
    """sample name → [(how, row)] for one dict lookup per sample."""
    index: dict[str, list[_Entry]] = {}
    for src in CATALOG:
        if src.kind == "label":
            continue
        how = src.naming if src.kind == "offload" and src.naming else src.kind
        index.setdefault(src.name, []).append((how, src))
        if src.kind != "gauge":
            index.setdefault(_created_name(src.name), []).append(("created_" + how, src))
    index[CACHE_CONFIG_INFO] = [("cache_config", None)]
    index[OFFLOAD_CONFIG_INFO] = [("offload_config", None)]
    return index


_INDEX = _build_index()


def wanted(name: str) -> bool:
    """The parser's filter: keep only samples the catalog reads."""
    return name in _INDEX


def value_range(name: str, labels: dict[str, str]) -> Range:
    """The range a sample's value must lie in for extract to take it: the narrowest of its rows.

    A `_created` time, a config info sample or a sample no row reads: any believable number.
    """
    low, high = BELIEVABLE.low, BELIEVABLE.high
    for how, src in _INDEX.get(name, ()):
        if src is None or how.startswith("created_"):
            continue
        if not src.matches(labels):
            continue
        low, high = max(low, src.range.low), min(high, src.range.high)
    return Range(low, high)


def _families_of(names: list[str]) -> frozenset[str]:
    out = set()
    for name in names:
        out.add(name)
        for suffix in ("_total", "_count", "_sum", "_bucket", "_created"):
            if name.endswith(suffix):
                out.add(name[: -len(suffix)])
    return frozenset(out)


# Families worth looking into; the parser skips every other family whole.
WANTED_FAMILIES = _families_of(list(_INDEX))


# (instance, model_name, engine)
SeriesKey = tuple[str, str, str]


@dataclass
class Extract:
    """What one scrape says, in canonical keys, per (instance, model, engine)."""

    timestamp: float
    counters: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    created: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    gauges: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    # (instance, engine) → labels of vllm:cache_config_info (no model_name on that metric).
    cache_config: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    # (instance, model, engine) → labels of vllm:kv_offload_config_info.
    offload_config: dict[SeriesKey, dict[str, str]] = field(default_factory=dict)
    # instance → True when any vllm:kv_offload_* family is declared.
    offload_families: dict[str, bool] = field(default_factory=dict)
    # instance → set of model names seen.
    models: dict[str, set[str]] = field(default_factory=dict)
    # instance → "flat" | "legacy" | None per direction, for the report.
    offload_naming: dict[str, str] = field(default_factory=dict)
    # Counter and gauge series whose value was outside its row's range (NaN, infinite, beyond
    # MAX_VALUE, a negative counter, a usage of 7), each with why (the series and its value):
    # there but unknown this scrape (the window makes the figures that read them absent, not
    # a restart when they come back).
    unknown: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    # How many of them were numbers within ±MAX_VALUE, only outside their row's range (the
    # sidecar counts them as samples rejected for reason="range").
    out_of_range: int = 0
    # The secondary tiers whose counters are kept apart this scrape (at most MAX_TIERS).
    tiers: set[str] = field(default_factory=set)


def believable(value: float) -> bool:
    """A sample value the figures may use: finite and within ±MAX_VALUE (NaN is neither)."""
    return -MAX_VALUE <= value <= MAX_VALUE


def series_text(name: str, labels: dict[str, str]) -> str:
    """A series as PromQL writes it, without the labels its group already names."""
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in _GROUP_LABELS)
    return f"{name}{{{shown}}}" if shown else name


_GROUP_LABELS = frozenset({"instance", "job"})


def why_unknown(name: str, labels: dict[str, str], value: float, within: Range) -> str:
    """Why a sample is not believed, in one line: the series, its value and its range."""
    if value != value:  # NaN: what read_numbers makes of a sample stamped with a bad time too
        return f"{series_text(name, labels)} is NaN (or was stamped with a time not believed)"
    return f"{series_text(name, labels)} = {value:g}, outside {within}"


def extract(
    expo: Exposition, timestamp: float, default_instance: str, judge: bool = True
) -> Extract:
    """Turn one parsed scrape into canonical keyed values.

    `default_instance` names the target when samples carry no `instance` label (a live scrape).
    `judge=False` takes every value as it is (ingest.shapes uses it to learn where samples go).
    """
    out = Extract(timestamp=timestamp)
    families = expo.families
    has_offload = any(f.startswith(OFFLOAD_FAMILY_PREFIXES) for f in families)
    use_flat = {d: fam in families for d, fam in FLAT_FAMILY.items()}
    instances: set[str] = set()
    for name, labels, value, _ts in expo.samples:
        entries = _INDEX.get(name)
        if not entries:
            continue
        instance = labels.get("instance", default_instance)
        instances.add(instance)
        for how, src in entries:
            if src is None:
                if how == "cache_config":
                    out.cache_config[(instance, labels.get("engine", "0"))] = labels
                    continue
                # Under TieringOffloadingSpec each secondary tier has its own series with the
                # CPU keys empty: only the CPU (primary) tier's facts size the CPU tier.
                if labels.get("tier", "0:primary") == "0:primary" or labels.get(
                    "cpu_kv_cache_size_bytes"
                ):
                    out.offload_config[
                        (instance, labels.get("model_name", ""), labels.get("engine", "0"))
                    ] = labels
                continue
            if not src.matches(labels):
                continue
            # Offload transfers (the rows with a direction): the flat series when its family
            # is there, else the legacy one, never both.
            if src.direction is not None and use_flat[src.direction] != how.endswith("flat"):
                continue
            model = labels.get("model_name", "")
            skey = (src.key, instance, model, labels.get("engine", "0"))
            created = how.startswith("created_")
            within = BELIEVABLE if created else src.range
            if judge and not within.low <= value <= within.high:
                # NaN/Inf (or 1e308, whose sums overflow to inf) would poison every sum it
                # enters, a usage of 7 or a negative count every figure: absent this scrape,
                # noted as unknown with why (a `_created` time only says less of restarts)
                if not created:
                    out.unknown[skey] = why_unknown(name, labels, value, within)
                    if believable(value):
                        out.out_of_range += 1
                continue
            if created:
                # Of several tiers' series the earliest: a tier's first promotion creating its
                # series later is no restart (a restart moves every `_created` forward).
                seen = out.created.get(skey) if src.regex else None
                out.created[skey] = value if seen is None else min(seen, value)
            else:
                into = out.gauges if src.kind == "gauge" else out.counters
                # One series per tier on an engine: added, as PromQL's `sum by` adds them.
                into[skey] = value + into.get(skey, 0.0) if src.regex else value
                if src.kind == "counter" and src.regex and src.label == "tier":
                    _per_tier(out, skey, labels.get("tier", ""), value)
            if model:
                out.models.setdefault(instance, set()).add(model)
    for instance in instances or {default_instance}:
        out.offload_families[instance] = has_offload
        naming = "flat" if use_flat["load"] or use_flat["store"] else "legacy"
        out.offload_naming[instance] = naming if has_offload else "none"
    return out


# Each secondary tier's counters are also kept apart, as `<key>@<tier>` (signals.per_tier_figures).
# vLLM's tiers are a handful; more, or a longer label, is not read apart (the sum still is).
MAX_TIERS = 8
MAX_TIER_LABEL = 64


def per_tier_key(key: str, tier: str) -> str:
    return f"{key}@{tier}"


def _per_tier(out: Extract, skey: tuple[str, str, str, str], tier: str, value: float) -> None:
    """One secondary tier's counter under its own key, within MAX_TIERS tiers a scrape."""
    if not tier or len(tier) > MAX_TIER_LABEL:
        return
    if tier not in out.tiers:
        if len(out.tiers) >= MAX_TIERS:
            return
        out.tiers.add(tier)
    key, instance, model, engine = skey
    out.counters[(per_tier_key(key, tier), instance, model, engine)] = value


def label_number(labels: dict[str, str] | None, name: str) -> float | None:
    """A numeric label value (`"146"`), or None when absent, "None", garbage or out of range.

    The range is the catalog's for that label (any believable number if it has none).
    """
    if not labels:
        return None
    raw = labels.get(name)
    if raw is None or raw in ("None", ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    # "inf", "nan", "1e308", a block size of -16: garbage too
    return value if LABEL_RANGES.get(name, BELIEVABLE).holds(value) else None
