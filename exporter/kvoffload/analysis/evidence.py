"""What KV events add to a group's analysis: the curve and the exact figures counters lack."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.analysis.signals import static_bytes_per_token
from kvoffload.analysis.window import GroupStatic
from kvoffload.ingest.catalog import BYTES_PER_BLOCK, label_number
from kvoffload.kvevents.curve import Curve, build_curve
from kvoffload.kvevents.state import TargetEvents


def provisional_reasons(
    events: TargetEvents,
    gpu_blocks_per_engine: float | None,
    min_gpu_turnovers: float,
    max_first_touch_gap: float,
) -> list[str]:
    """Why the curve cannot size a tier yet, in words (empty: it can)."""
    reasons = []
    unseen, lost = events.unseen_before_start(), events.lost_messages()
    if unseen or lost:
        reasons.append(
            f"the curve comes from a partial stream ({unseen:,} messages published before the "
            f"sidecar listened and no longer in vLLM's replay buffer, {lost:,} lost in gaps): "
            "its hit ratios and sizes undercount reuse until the stream has covered the "
            "workload again"
        )
    engines = max(len(events.engines), 1)
    missed = sum(e.gpu_missed_blocks for e in events.engines.values()) / engines
    if gpu_blocks_per_engine and missed < min_gpu_turnovers * gpu_blocks_per_engine:
        reasons.append(
            f"the stream holds {missed:,.0f} GPU-missed blocks per engine, fewer than "
            f"{min_gpu_turnovers:g} turnovers of the GPU cache ({gpu_blocks_per_engine:,.0f} "
            "blocks): too early to see what a CPU tier would serve"
        )
    ratios = events.first_touch_ratios()
    if ratios is not None and ratios[0] - ratios[1] > max_first_touch_gap:
        reasons.append(
            f"the stream is still warming up: {ratios[0]:.0%} of GPU-missed blocks were first "
            f"touches over the whole stream, {ratios[1]:.0%} over its recent half; the curve's "
            "hit ratios are low by about the gap until first touches stop dominating"
        )
    return reasons


@dataclass(frozen=True)
class EventEvidence:
    curve: Curve | None
    bytes_per_block: float | None
    current_cpu_bytes_per_engine: float | None
    json: dict[str, object]


def bytes_per_block(
    static: GroupStatic, figures: dict[str, float | None], events: TargetEvents
) -> float | None:
    """The CPU tier's slot size per block, fixed once known (see TargetEvents)."""
    if events.bytes_per_block is None:
        events.bytes_per_block = _bytes_per_block(static, figures, events)
    return events.bytes_per_block


def _bytes_per_block(
    static: GroupStatic, figures: dict[str, float | None], events: TargetEvents
) -> float | None:
    """_block_bytes when believable (within catalog.BYTES_PER_BLOCK), else None: no curve and no
    byte figure from the events."""
    size = _block_bytes(static, figures, events)
    return size if size is not None and BYTES_PER_BLOCK.holds(size) else None


def _block_bytes(
    static: GroupStatic, figures: dict[str, float | None], events: TargetEvents
) -> float | None:
    """From kv_offload_config_info (page-aligned, as allocated), else KV bytes per token × block
    size."""
    for labels in static.offload_config:
        size = label_number(labels, "cpu_kv_cache_size_bytes")
        chunks = label_number(labels, "cpu_num_chunks")
        per_chunk = label_number(labels, "cpu_blocks_per_chunk") or 1.0
        if size and chunks:
            return size / (chunks * per_chunk)
    block_size = events.block_size or next(
        (
            label_number(lb, "block_size")
            for lb in static.cache_config
            if label_number(lb, "block_size")
        ),
        None,
    )
    per_token = static_bytes_per_token(static) or figures.get("kv_bytes_per_token")
    return per_token * block_size if per_token and block_size else None


def event_evidence(
    events: TargetEvents,
    static: GroupStatic,
    figures: dict[str, float | None],
    missed_tokens: float | None,
) -> EventEvidence:
    engines = max(len(static.engines), 1)
    bpb = bytes_per_block(static, figures, events)
    cpu_total = figures.get("cpu_capacity_bytes") if static.offload_families else None
    gpu_total = figures.get("gpu_capacity_bytes")
    current = cpu_total / engines if cpu_total else None
    gpu = gpu_total / engines if gpu_total else None
    curve = (
        build_curve(events, bpb, missed_tokens, tuple(x for x in (current, gpu) if x))
        if bpb
        else None
    )
    evicted, resident = events.never_loaded_blocks()
    info: dict[str, object] = {
        "messages": events.messages(),
        "lost_messages": events.lost_messages(),
        # Published before we listened and no longer in vLLM's replay buffer: history the
        # curve does not contain.
        "unseen_before_start": events.unseen_before_start(),
        "history_from_seq": {
            str(rank): e.history_from_seq for rank, e in sorted(events.engines.items())
        },
        "sample_rate": events.sample_rate_now(),
        "tracked_blocks": events.tracked_blocks(),
        "cpu_resident_blocks": events.cpu_resident_blocks(),
        "cpu_resident_bytes": events.cpu_resident_blocks() * bpb if bpb else None,
        # Loads the events show, with repeats: equal to vLLM's load-bytes counter over the
        # same span when the classification of never-loaded blocks is right.
        "cpu_loaded_bytes": events.cpu_loaded_blocks() * bpb if bpb else None,
        # Stores the tiers below the CPU report (vLLM's fs tier with enable_kv_events), against
        # whatif.secondary_tier's tier_written_bytes.
        "tier_stored_bytes": events.tier_stored_blocks() * bpb if bpb else None,
        "never_loaded_evicted_bytes": evicted * bpb if bpb else None,
        "never_loaded_resident_bytes": resident * bpb if bpb else None,
        "bytes_per_block": bpb,
    }
    ratios = events.first_touch_ratios()
    info["first_touch_ratio"] = ratios[0] if ratios else None
    info["recent_first_touch_ratio"] = ratios[1] if ratios else None
    if curve is not None:
        info["achievable_hit_ratio"] = curve.achievable_hit_ratio
        info["right_size_gib"] = curve.right_size_bytes / 2**30 if curve.right_size_bytes else None
        if current:
            info["predicted_offload_hit_ratio_current"] = curve.at(current, events)
    return EventEvidence(curve, bpb, current, info)
