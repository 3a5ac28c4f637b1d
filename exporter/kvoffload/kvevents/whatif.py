"""Exact what-ifs from the KV events: `store_threshold` (N = 1..4), eviction, and a tier below.

Neither knob has the curve's stack property. So each (size, policy, N) is its own simulation of
vLLM 0.26.0's CPU tier over the curve's lookups, alone or over its fs tier. Rules and limits:
docs/sizing.md ("What-ifs", "A tier below, replayed").
"""

from __future__ import annotations

import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvoffload.kvevents.eventfile import read_event_file
from kvoffload.kvevents.stackdist import StackDistanceTracker
from kvoffload.kvevents.state import EngineEvents, TargetEvents

THRESHOLDS = (1, 2, 3, 4)
POLICIES = ("lru", "arc")
MAX_TRACKER_SIZE = 64_000  # vLLM's default (cpu/spec.py, CPUOffloadingSpec.get_manager)
DEFAULT_MAX_BLOCKS = 1 << 21

# The event file each offline TargetEvents was read from (analyze --events): the what-if is a
# second pass over it once the sizes are known. The live sidecar registers none: its what-ifs
# are simulated as the lookups arrive (LiveWhatIf).
_SOURCES: weakref.WeakKeyDictionary[TargetEvents, str] = weakref.WeakKeyDictionary()


def register_source(events: TargetEvents, path: str) -> None:
    _SOURCES[events] = path


def source_of(events: TargetEvents) -> str | None:
    return _SOURCES.get(events)


@dataclass(frozen=True)
class Config:
    capacity_blocks: int
    policy: str = "lru"
    store_threshold: int = 1
    max_tracker_size: int = MAX_TRACKER_SIZE
    # An unbounded write-through tier under this one (TieringOffloadingSpec's fs tier).
    below: bool = False


@dataclass
class Outcome:
    """What one simulated tier did over the stream (blocks; × bytes per block for bytes)."""

    looked_up_blocks: int = 0  # GPU-missed blocks (the hit ratio's denominator)
    hit_blocks: int = 0  # loaded from the tier
    stored_blocks: int = 0
    evicted_never_loaded_blocks: int = 0
    resident_never_loaded_blocks: int = 0
    failed_stores: int = 0  # prepare_store returned None: nothing could be evicted
    lookups: int = 0  # requests whose GPU-missed blocks were looked up
    tier_hit_blocks: int = 0  # of hit_blocks, found only in the tier below and promoted
    omitted: bool = False  # stopped: over max_blocks

    @property
    def never_loaded_blocks(self) -> int:
        return self.evicted_never_loaded_blocks + self.resident_never_loaded_blocks

    def add(self, other: Outcome) -> None:
        for name in (
            "looked_up_blocks",
            "hit_blocks",
            "stored_blocks",
            "evicted_never_loaded_blocks",
            "resident_never_loaded_blocks",
            "failed_stores",
            "lookups",
            "tier_hit_blocks",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.omitted = self.omitted or other.omitted


class TierSim:
    """One engine's CPU tier under one Config; `request` per lookup. The resident dicts map a
    key to whether it was loaded since stored."""

    def __init__(self, config: Config, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.config = config
        self.max_blocks = max_blocks
        self.out = Outcome()
        # The tier below keeps its blocks across resets, as vLLM's persistent tiers do.
        self.below: set[int] | None = set() if config.below else None
        self._clear()

    def _clear(self) -> None:
        # LRU: one list, least recent first (LRUCachePolicy.evictable_blocks). ARC: T1, T2
        # and ghosts B1, B2 (ARCCachePolicy), target_t1_size p.
        self.t1: OrderedDict[int, bool] = OrderedDict()
        self.t2: OrderedDict[int, bool] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0
        # CPUOffloadingManager.counts: None below threshold 2
        self.counts: OrderedDict[int, int] | None = (
            OrderedDict() if self.config.store_threshold >= 2 else None
        )

    def reset(self) -> None:
        """AllBlocksCleared or a restart: the tier empties, its blocks counted as never loaded."""
        self.out.evicted_never_loaded_blocks += self._never_loaded_now()
        self._clear()

    def _never_loaded_now(self) -> int:
        return sum(not v for v in self.t1.values()) + sum(not v for v in self.t2.values())

    def finish(self) -> Outcome:
        self.out.resident_never_loaded_blocks = self._never_loaded_now()
        return self.out

    def _get(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def request(self, hashes: Sequence[int], ancestors: Sequence[int]) -> None:
        if self.out.omitted:
            return
        cfg, counts, arc = self.config, self.counts, self.config.policy == "arc"
        t1, t2, below = self.t1, self.t2, self.below
        self.out.looked_up_blocks += len(hashes)
        self.out.lookups += 1
        # 1. scheduler._maximal_prefix_lookup → CPUOffloadingManager.lookup (the tiering
        # manager's: a block only below is promoted, and a full CPU tier makes it a miss)
        hits = 0
        for key in hashes:
            if counts is not None:
                if key in counts:
                    counts.move_to_end(key)
                    counts[key] += 1
                else:
                    if len(counts) >= cfg.max_tracker_size:
                        counts.popitem(last=False)
                    counts[key] = 1
            if (
                key not in t1
                and key not in t2
                and (below is None or key not in below or not self._promote(key, hashes, ancestors))
            ):
                break
            hits += 1
        # 2. scheduler._touch → policy.touch over the request's keys, prefix first
        keys = [*ancestors, *hashes]
        if arc:
            self._arc_touch(keys)
        else:
            for key in reversed(keys):  # LRUCachePolicy.touch
                if key in t1:
                    t1.move_to_end(key)
        # 3. prepare_load / complete_load of the leading run
        loaded = hashes[:hits]
        self.out.hit_blocks += hits
        for key in loaded:
            if arc:
                if key in t1:
                    t1[key] = True
                else:
                    t2[key] = True
            else:  # mark_non_evictable, then mark_evictable: most recent, in order
                t1.pop(key)
                t1[key] = True
        # 4. CPUOffloadingManager.prepare_store + complete_store
        self._store(hashes)
        held = len(t1) + len(t2) + len(self.b1) + len(self.b2) + len(below or ())
        if held > self.max_blocks:
            self.out.omitted = True
            self._clear()

    def _arc_touch(self, keys: list[int]) -> None:
        """ARCCachePolicy.touch (every block ready: transfers are instantaneous here)."""
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        cap = self.config.capacity_blocks
        for key in reversed(keys):
            if key in t1:
                t2[key] = t1.pop(key)
            elif key in t2:
                t2.move_to_end(key)
            elif key in b1:
                self.p = min(self.p + max(1, len(b2) / len(b1)), cap)
                b1.move_to_end(key)
            elif key in b2:
                self.p = max(self.p - max(1, len(b1) / len(b2)), 0)
                b2.move_to_end(key)

    def _promote(self, key: int, hashes: Sequence[int], ancestors: Sequence[int]) -> bool:
        """A block from the tier below into the CPU tier (prepare_write of one key).

        Why: vLLM allocates the slot at lookup, evicting as a store does, and misses when it cannot.
        """
        free = self.config.capacity_blocks - len(self.t1) - len(self.t2)
        if free <= 0 and not self._evict(1 - free, {*ancestors, *hashes}):
            return False
        self.t1[key] = False  # marked loaded by step 3, as a CPU hit is
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        self.out.tier_hit_blocks += 1
        return True

    def _store(self, hashes: Sequence[int]) -> None:
        cfg, counts = self.config, self.counts
        keys: Sequence[int] = hashes
        if counts is not None:
            keys = [k for k in keys if counts.get(k, 0) >= cfg.store_threshold]
        to_store = [k for k in keys if not self._get(k)]
        if not to_store:
            return
        resident = len(self.t1) + len(self.t2)
        need = len(to_store) - (cfg.capacity_blocks - resident)
        if need > 0 and (need > resident or not self._evict(need, set(keys))):
            self.out.failed_stores += 1
            return
        for key in to_store:
            self.t1[key] = False  # LRU: appended on complete_store; ARC: insert into T1
            if cfg.policy == "arc":
                self.b1.pop(key, None)
                self.b2.pop(key, None)
        self.out.stored_blocks += len(to_store)
        if self.below is not None:  # complete_store cascades to every tier below
            self.below.update(to_store)

    def _evict(self, n: int, protected: set[int]) -> bool:
        """LRUCachePolicy.evict / ARCCachePolicy.evict: all or nothing."""
        t1, t2 = self.t1, self.t2
        chosen: list[tuple[int, bool]] = []  # (key, from T1)
        if self.config.policy != "arc":
            for key in t1:
                if key not in protected:
                    chosen.append((key, True))
                    if len(chosen) == n:
                        break
        else:
            picked: set[int] = set()
            virtual_t1 = len(t1)
            for _ in range(n):
                found = None
                if virtual_t1 >= int(self.p):
                    found = next((k for k in t1 if k not in protected and k not in picked), None)
                    if found is not None:
                        virtual_t1 -= 1
                        chosen.append((found, True))
                if found is None:
                    found = next((k for k in t2 if k not in protected and k not in picked), None)
                    if found is None:
                        return False
                    chosen.append((found, False))
                picked.add(found)
        if len(chosen) < n:
            return False
        for key, from_t1 in chosen:
            loaded = t1.pop(key) if from_t1 else t2.pop(key)
            if not loaded:
                self.out.evicted_never_loaded_blocks += 1
            if self.config.policy == "arc":
                (self.b1 if from_t1 else self.b2)[key] = None
        if self.config.policy == "arc":
            cap = self.config.capacity_blocks
            for ghost in (self.b1, self.b2):
                for _ in range(len(ghost) - cap):
                    ghost.popitem(last=False)
        return True


class _ForwardingTracker(StackDistanceTracker):
    """An EngineEvents' tracker slot: each lookup goes to the simulations, no distance recorded."""

    def __init__(self, sims: list[TierSim]) -> None:
        super().__init__()
        self.sims = sims

    def lookup(self, hashes: Sequence[int], ancestors: Sequence[int] = ()) -> None:
        self.accesses += len(hashes)
        for sim in self.sims:
            sim.request(hashes, ancestors)

    def reset(self) -> None:
        super().reset()
        for sim in getattr(self, "sims", ()):
            sim.reset()


class WhatIfEvents(TargetEvents):
    """TargetEvents whose engines feed one TierSim per Config instead of a distance tracker."""

    def __init__(self, configs: Iterable[Config], max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        super().__init__()
        self.configs = list(configs)
        self.max_blocks = max_blocks
        self.sims: dict[int, list[TierSim]] = {}

    def engine(self, rank: int) -> EngineEvents:
        eng = self.engines.get(rank)
        if eng is None:
            eng = super().engine(rank)
            sims = [TierSim(c, self.max_blocks) for c in self.configs]
            self.sims[rank] = sims
            eng.tracker = _ForwardingTracker(sims)
        return eng

    def outcomes(self) -> list[Outcome]:
        """Per Config, summed over engines (each engine has its own tier)."""
        return _summed(len(self.configs), self.sims)


def _summed(configs: int, sims_by_rank: dict[int, list[TierSim]]) -> list[Outcome]:
    """Each Config's outcome summed over the engines' simulations (one tier per engine)."""
    out = [Outcome() for _ in range(configs)]
    for sims in sims_by_rank.values():
        for total, sim in zip(out, sims, strict=True):
            total.add(sim.finish())
    return out


def replay_configs(
    path: str, configs: Sequence[Config], max_blocks: int = DEFAULT_MAX_BLOCKS
) -> list[Outcome]:
    """Every Config over a recorded KV-event file (a second pass: sizes are known by then)."""
    state = WhatIfEvents(configs, max_blocks)
    for msg in read_event_file(path):
        state.ingest_message(msg)
    return state.outcomes()


@dataclass
class WhatIf:
    """The what-if rows of one group, ready for JSON."""

    threshold_rows: list[dict[str, object]] = field(default_factory=list)
    eviction_rows: list[dict[str, object]] = field(default_factory=list)
    tier_rows: list[dict[str, object]] = field(default_factory=list)
    basis: str = (
        "exact replay of vLLM 0.26.0's store_threshold, lru/arc and fs-tier rules over the "
        "GPU-missed lookups of the KV events; transfers taken as instantaneous"
    )

    def to_json(self) -> dict[str, object]:
        return {
            "store_threshold": self.threshold_rows,
            "eviction": self.eviction_rows,
            "secondary_tier": self.tier_rows,
            "basis": self.basis,
        }


def whatif_for_file(
    path: str,
    bytes_per_block: float,
    block_size: int,
    sizes: dict[str, float],
    curve_sizes: Sequence[float] = (),
    missed_tokens: float | None = None,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
) -> WhatIf:
    """What-if rows of an event file at each named size and curve size.

    `sizes`: named tier sizes per engine in bytes, each with store_threshold and eviction rows.
    `curve_sizes`: more sizes for eviction rows.
    Hit ratios are over missed_tokens when it is at least the events' full-block tokens, else over
    the events'.
    """
    named = {name: s for name, s in sizes.items() if s and s > 0 and math.isfinite(s)}
    eviction_sizes = sorted({*named.values(), *(s for s in curve_sizes if s > 0)})
    configs: list[Config] = []
    keys: list[tuple[str, float, str, int]] = []
    for name, s in named.items():
        for n in THRESHOLDS:
            configs.append(Config(int(s // bytes_per_block), "lru", n))
            keys.append(("threshold", s, name, n))
    for s in eviction_sizes:
        for policy in POLICIES:
            configs.append(Config(int(s // bytes_per_block), policy, 1))
            keys.append(("eviction", s, policy, 1))
    for name, s in named.items():
        configs.append(Config(int(s // bytes_per_block), "lru", 1, below=True))
        keys.append(("tier", s, name, 1))
    outcomes = replay_configs(path, configs, max_blocks)
    result = WhatIf()
    for (kind, s, label, n), o in zip(keys, outcomes, strict=True):
        row = _row(o, s, bytes_per_block, block_size, missed_tokens)
        if kind == "threshold":
            result.threshold_rows.append({"size": label, "store_threshold": n, **row})
        elif kind == "tier":
            result.tier_rows.append({"size": label, **row, **_tier_columns(o, row, block_size)})
        else:
            named_as = [name for name, v in named.items() if v == s]
            result.eviction_rows.append(
                {"policy": label, "size": named_as[0] if named_as else None, **row}
            )
    return result


def _row(
    o: Outcome, size: float, bytes_per_block: float, block_size: int, missed_tokens: float | None
) -> dict[str, object]:
    """One simulated tier as a JSON row.

    Its hit ratio is over missed_tokens, or over its own looked-up tokens when those are more.
    """
    own = o.looked_up_blocks * block_size
    denominator = missed_tokens if missed_tokens and missed_tokens >= own else own
    return {
        "cpu_gib": size / 2**30,
        "omitted": o.omitted,
        "cpu_hit_ratio": None
        if o.omitted or not denominator
        else o.hit_blocks * block_size / denominator,
        "stored_bytes": None if o.omitted else o.stored_blocks * bytes_per_block,
        "stored_never_loaded_bytes": None if o.omitted else o.never_loaded_blocks * bytes_per_block,
        "failed_stores": o.failed_stores,
    }


def _tier_columns(o: Outcome, row: dict[str, object], block_size: int) -> dict[str, object]:
    """What the tier below adds to a row: its share of the hits and tokens a lookup."""
    hit = row["cpu_hit_ratio"]
    share = None
    if isinstance(hit, float):
        share = hit * o.tier_hit_blocks / o.hit_blocks if o.hit_blocks else 0.0
    return {
        "tier_hit_ratio": share,
        "tier_tokens_per_lookup": None
        if o.omitted or not o.lookups
        else o.tier_hit_blocks * block_size / o.lookups,
        "tier_written_bytes": row["stored_bytes"],
    }


# The live sidecar's what-ifs: N = 1..4 under LRU and ARC at N = 1, all at the current size, and
# LRU over a tier below (last).
LIVE_CONFIGS = (*(("lru", n) for n in THRESHOLDS), ("arc", 1))
# The tier below holds every block stored: its simulation may hold this many times the CPU tier's.
LIVE_BELOW_FACTOR = 4
# The largest tier, in blocks, the live what-ifs simulate (36 GiB of Qwen3-8B's 2.25 MiB
# blocks): the 5 simulations full hold ~45 MB (tracemalloc; vLLM's 64,000-key sighting tables
# of N = 2..4 are a third of it); a larger tier's rows say they were omitted (analyze --events
# has the sampling budget's cap instead).
LIVE_MAX_BLOCKS = 1 << 14
_LIVE: weakref.WeakKeyDictionary[TargetEvents, LiveWhatIf] = weakref.WeakKeyDictionary()


class LiveWhatIf:
    """The knobs' what-ifs next to a running vLLM: TierSims at the current size, fed live.

    Why: the sidecar keeps no event file for a second pass, and the same simulations give analyze
    --events' rows, counted from when the size was known.
    """

    def __init__(self, events: TargetEvents, capacity_blocks: int, since: float) -> None:
        self.capacity_blocks = capacity_blocks
        self.since = since
        self.configs = [Config(capacity_blocks, policy, n) for policy, n in LIVE_CONFIGS]
        self.configs.append(Config(capacity_blocks, "lru", 1, below=True))
        self.sims: dict[int, list[TierSim]] = {}
        events.listeners_for = self._new
        for rank, eng in events.engines.items():
            eng.lookup_listeners = self._new(rank)

    def _new(self, rank: int) -> list[TierSim]:
        # ARC holds up to twice its tier (T1 + T2 and the ghosts B1 + B2)
        factor = {"arc": 2, "below": LIVE_BELOW_FACTOR}
        sims = [
            TierSim(c, LIVE_MAX_BLOCKS * factor.get("below" if c.below else c.policy, 1))
            for c in self.configs
        ]
        self.sims[rank] = sims
        return list(sims)

    def rows(self, bytes_per_block: float, block_size: int, capacity_bytes: float) -> WhatIf | None:
        """The rows so far, summed over engines; None before the first lookup."""
        out = _summed(len(self.configs), self.sims)
        if not out[0].looked_up_blocks:
            return None
        result = WhatIf(basis=_live_basis(self.since, out[0].looked_up_blocks))
        for (policy, n), o in zip(LIVE_CONFIGS, out[: len(LIVE_CONFIGS)], strict=True):
            row = _row(o, capacity_bytes, bytes_per_block, block_size, None)
            if policy == "lru":
                result.threshold_rows.append({"size": "current", "store_threshold": n, **row})
            if n == 1:
                result.eviction_rows.append({"policy": policy, "size": "current", **row})
        below = out[len(LIVE_CONFIGS)]
        row = _row(below, capacity_bytes, bytes_per_block, block_size, None)
        result.tier_rows.append({"size": "current", **row, **_tier_columns(below, row, block_size)})
        return result


def _live_basis(since: float, blocks: int) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    return (
        f"live replay of vLLM 0.26.0's store_threshold, lru/arc and fs-tier rules over the "
        f"{blocks:,} GPU-missed blocks looked up since {started} (when the tier's size was "
        "known), at the current size; transfers taken as instantaneous"
    )


def live_whatif(
    events: TargetEvents, bytes_per_block: float, capacity_bytes: float, now: float
) -> WhatIf | None:
    """One target's live what-if rows.

    Its simulations start once the size is known, and restart when the size in blocks moves.
    """
    if not bytes_per_block or not capacity_bytes or not events.block_size:
        return None
    blocks = int(capacity_bytes // bytes_per_block)
    if blocks <= 0:
        return None
    live = _LIVE.get(events)
    if live is None or live.capacity_blocks != blocks:
        live = _LIVE[events] = LiveWhatIf(events, blocks, now)
        return None
    return live.rows(bytes_per_block, events.block_size, capacity_bytes)


def _rows(whatif: dict[str, object], kind: str) -> list[dict[str, object]]:
    rows = whatif.get(kind)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _gib(value: object) -> str:
    return f"{value / 2**30:.2f}" if isinstance(value, float | int) else "n/a"


def summary_lines(whatif: dict[str, object], size: str | None = None) -> list[str]:
    """One or two report lines: the store_threshold rows and LRU against ARC at `size`.

    `size`: "advised" or "current"; None: the advised size if any, else the current.
    """
    lines = []
    rows = _rows(whatif, "store_threshold")
    if size is None or not any(r.get("size") == size for r in rows):
        size = "advised" if any(r.get("size") == "advised" for r in rows) else "current"
    picked = [r for r in rows if r.get("size") == size and not r.get("omitted")]
    if picked:
        parts = [
            f"N={r['store_threshold']}: hit {r['cpu_hit_ratio']:.2f}, stored "
            f"{_gib(r['stored_bytes'])} GiB ({_gib(r['stored_never_loaded_bytes'])} never reloaded)"
            for r in picked
            if isinstance(r.get("cpu_hit_ratio"), float)
        ]
        lines.append(f"  what-if store_threshold at the {size} size: " + "; ".join(parts))
    ev = [r for r in _rows(whatif, "eviction") if r.get("size") == size and not r.get("omitted")]
    if len(ev) == 2 and all(isinstance(r.get("cpu_hit_ratio"), float) for r in ev):
        lines.append(
            f"  what-if eviction at the {size} size ({ev[0]['cpu_gib']:.3g} GiB): "
            + ", ".join(f"{r['policy']} hit {r['cpu_hit_ratio']:.3f}" for r in ev)
        )
    tier = [r for r in _rows(whatif, "secondary_tier") if r.get("size") == size]
    if tier and isinstance(tier[0].get("tier_hit_ratio"), float):
        r = tier[0]
        lines.append(
            f"  what-if a file-system tier below at the {size} size: hit {r['cpu_hit_ratio']:.3f}"
            f" ({r['tier_hit_ratio']:.3f} of it from the tier), {_gib(r['tier_written_bytes'])} "
            "GiB written there"
        )
    return lines
