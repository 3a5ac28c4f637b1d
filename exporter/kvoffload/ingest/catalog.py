"""The vLLM metric catalog: which samples we read, under their current and legacy names.

Everything downstream works on canonical keys (`load_bytes`, `prefix_hits`, ...) so the
rest of the package never sees the naming history (docs/rules.md, "Conventions"):
flat `vllm:kv_offload_{load,store}_*` (≥0.24) are preferred; the deprecated
`vllm:kv_offload_total_*{transfer_type}` series are used only when the flat family is absent,
so the two are never added together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.ingest.parse import Exposition

# Canonical counter key → (sample name, required label, value). Label None: no filter.
_CounterSource = tuple[str, str | None, str | None]

CORE_COUNTERS: dict[str, _CounterSource] = {
    "prefix_queries": ("vllm:prefix_cache_queries_total", None, None),
    "prefix_hits": ("vllm:prefix_cache_hits_total", None, None),
    "ext_queries": ("vllm:external_prefix_cache_queries_total", None, None),
    "ext_hits": ("vllm:external_prefix_cache_hits_total", None, None),
    "prompt_tokens": ("vllm:prompt_tokens_total", None, None),
    "src_local_compute": ("vllm:prompt_tokens_by_source_total", "source", "local_compute"),
    "src_local_cache_hit": ("vllm:prompt_tokens_by_source_total", "source", "local_cache_hit"),
    "src_external": ("vllm:prompt_tokens_by_source_total", "source", "external_kv_transfer"),
    "cached_host": ("vllm:prompt_tokens_cached_by_source_total", "source", "host"),
    "cached_disk": ("vllm:prompt_tokens_cached_by_source_total", "source", "disk"),
    "allocation_failures": ("vllm:kv_offload_allocation_failure_total", None, None),
    "preemptions": ("vllm:num_preemptions_total", None, None),
    "prefill_time_sum": ("vllm:request_prefill_time_seconds_sum", None, None),
    "prefill_time_count": ("vllm:request_prefill_time_seconds_count", None, None),
    "queue_time_sum": ("vllm:request_queue_time_seconds_sum", None, None),
    "queue_time_count": ("vllm:request_queue_time_seconds_count", None, None),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum", None, None),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", None, None),
    # Counted together at request finish, so one scrape interval holds a request's prefill
    # time with its computed tokens (the TTFT model's marginal cost: analysis.intervals).
    "computed_tokens": ("vllm:request_prefill_kv_computed_tokens_sum", None, None),
    "computed_count": ("vllm:request_prefill_kv_computed_tokens_count", None, None),
    "e2e_sum": ("vllm:e2e_request_latency_seconds_sum", None, None),
    "e2e_count": ("vllm:e2e_request_latency_seconds_count", None, None),
    # Engine steps and the tokens they ran: a step's length when the engine never idles.
    "steps": ("vllm:iteration_tokens_total_count", None, None),
    "step_tokens": ("vllm:iteration_tokens_total_sum", None, None),
}

# Offload transfer counters: flat source, legacy source, and the flat family that decides.
FLAT_FAMILY = {
    "load": "vllm:kv_offload_load_bytes",
    "store": "vllm:kv_offload_store_bytes",
}
OFFLOAD_COUNTERS: dict[str, tuple[str, _CounterSource, _CounterSource]] = {
    "load_bytes": (
        "load",
        ("vllm:kv_offload_load_bytes_total", None, None),
        ("vllm:kv_offload_total_bytes_total", "transfer_type", "CPU_to_GPU"),
    ),
    "load_time": (
        "load",
        ("vllm:kv_offload_load_time_total", None, None),
        ("vllm:kv_offload_total_time_total", "transfer_type", "CPU_to_GPU"),
    ),
    "load_jobs": (
        "load",
        ("vllm:kv_offload_load_size_count", None, None),
        ("vllm:kv_offload_size_count", "transfer_type", "CPU_to_GPU"),
    ),
    "store_bytes": (
        "store",
        ("vllm:kv_offload_store_bytes_total", None, None),
        ("vllm:kv_offload_total_bytes_total", "transfer_type", "GPU_to_CPU"),
    ),
    "store_time": (
        "store",
        ("vllm:kv_offload_store_time_total", None, None),
        ("vllm:kv_offload_total_time_total", "transfer_type", "GPU_to_CPU"),
    ),
}

GAUGES: dict[str, _CounterSource] = {
    "gpu_kv_usage": ("vllm:kv_cache_usage_perc", None, None),
    "waiting_capacity": ("vllm:num_requests_waiting_by_reason", "reason", "capacity"),
    "running": ("vllm:num_requests_running", None, None),
}

# Gauges that count requests are summed over engines; ratios are averaged.
SUMMED_GAUGES = frozenset({"waiting_capacity", "running"})

CACHE_CONFIG_INFO = "vllm:cache_config_info"
OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
# The native OffloadingConnector, and SimpleCPUOffloadConnector (no bytes/time metrics).
OFFLOAD_FAMILY_PREFIXES = ("vllm:kv_offload_", "vllm:simple_kv_offload_")

GAUGE_KEYS: tuple[str, ...] = tuple(GAUGES)


def _created_name(sample_name: str) -> str:
    for suffix in ("_total", "_count", "_sum"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)] + "_created"
    return sample_name + "_created"


def _build_index() -> dict[str, list[tuple[str, str, str | None, str | None, str | None]]]:
    """sample name → [(kind, key, label, value, direction)] for one dict lookup per sample."""
    index: dict[str, list[tuple[str, str, str | None, str | None, str | None]]] = {}

    def add(kind: str, key: str, src: _CounterSource, direction: str | None) -> None:
        name, label, value = src
        index.setdefault(name, []).append((kind, key, label, value, direction))
        if kind in ("counter", "flat", "legacy"):
            index.setdefault(_created_name(name), []).append(
                ("created_" + kind, key, label, value, direction)
            )

    for key, src in CORE_COUNTERS.items():
        add("counter", key, src, None)
    for key, (direction, flat, legacy) in OFFLOAD_COUNTERS.items():
        add("flat", key, flat, direction)
        add("legacy", key, legacy, direction)
    for key, src in GAUGES.items():
        add("gauge", key, src, None)
    index[CACHE_CONFIG_INFO] = [("cache_config", "", None, None, None)]
    index[OFFLOAD_CONFIG_INFO] = [("offload_config", "", None, None, None)]
    return index


_INDEX = _build_index()


def wanted(name: str) -> bool:
    """The parser's filter: keep only samples the catalog reads."""
    return name in _INDEX


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
    # Counter series whose value was NaN, infinite or beyond MAX_VALUE: there but unknown this
    # scrape (the window makes the figures that read them absent, not a restart when they
    # come back).
    unknown: set[tuple[str, str, str, str]] = field(default_factory=set)


# No count, size, time or ratio vLLM reports comes near this (a day at 10 GB/s is 1e15
# bytes); a value beyond it is garbage, and products of a few such values (a fit's squares,
# a rate × a size) stay within the float range, so nothing downstream overflows to inf.
MAX_VALUE = 1e30


def believable(value: float) -> bool:
    """A sample value the figures may use: finite and within ±MAX_VALUE (NaN is neither)."""
    return -MAX_VALUE <= value <= MAX_VALUE


def all_believable(values: Iterable[float]) -> bool:
    """believable() of every value, at C speed (a recording's scrapes are checked whole)."""
    values = tuple(values)
    return all(map(math.isfinite, values)) and max(map(abs, values), default=0.0) <= MAX_VALUE


def extract(expo: Exposition, timestamp: float, default_instance: str) -> Extract:
    """Turn one parsed scrape into canonical keyed values.

    `default_instance` names the target when the samples carry no `instance` label (a live
    scrape); recordings carry it on every series.
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
        for kind, key, label, want, direction in entries:
            if label is not None and labels.get(label) != want:
                continue
            if kind == "cache_config":
                out.cache_config[(instance, labels.get("engine", "0"))] = labels
                continue
            model = labels.get("model_name", "")
            engine = labels.get("engine", "0")
            if kind == "offload_config":
                # Under TieringOffloadingSpec each secondary tier has its own series with the
                # CPU keys empty: only the CPU (primary) tier's facts size the CPU tier.
                if labels.get("tier", "0:primary") == "0:primary" or labels.get(
                    "cpu_kv_cache_size_bytes"
                ):
                    out.offload_config[(instance, model, engine)] = labels
                continue
            # Offload transfers (the kinds with a direction): the flat series when its family
            # is there, else the legacy one, never both.
            if direction is not None and use_flat[direction] != kind.endswith("flat"):
                continue
            skey = (key, instance, model, engine)
            if not believable(value):
                # NaN/Inf (or 1e308, whose sums overflow to inf) would poison every sum it
                # enters: absent this scrape, a counter noted as unknown
                if kind != "gauge" and not kind.startswith("created_"):
                    out.unknown.add(skey)
                continue
            if kind.startswith("created_"):
                out.created[skey] = value
            elif kind == "gauge":
                out.gauges[skey] = value
            else:
                out.counters[skey] = value
            if model:
                out.models.setdefault(instance, set()).add(model)
    for instance in instances or {default_instance}:
        out.offload_families[instance] = has_offload
        naming = "flat" if use_flat["load"] or use_flat["store"] else "legacy"
        out.offload_naming[instance] = naming if has_offload else "none"
    return out


def label_number(labels: dict[str, str] | None, name: str) -> float | None:
    """A numeric label value (`"146"`, `"0.65"`), or None for absent/"None"/garbage."""
    if not labels:
        return None
    raw = labels.get(name)
    if raw is None or raw in ("None", ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if believable(value) else None  # "inf", "nan", "1e308": garbage too
