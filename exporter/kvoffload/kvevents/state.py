"""What the KV-event stream of one target says: reuse distances, CPU occupancy, true waste.

One `EngineEvents` per DP rank (each engine has its own CPU tier). GPU `BlockStored` blocks are
exactly the GPU misses (computed or loaded), so they feed the stack-distance tracker; CPU
`BlockStored`/`BlockRemoved` give the tier's occupancy and, joined with later GPU misses of the
same hash, which stored blocks were ever loaded back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.errors import InputError
from kvoffload.kvevents.blockindex import ResidentBlocks
from kvoffload.kvevents.decode import CLEARED, REMOVED, STORED, Batch, decode_batch
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.stackdist import StackDistanceTracker

GPU_MEDIA = (None, "GPU", "gpu", "cuda")
CPU_MEDIA = ("CPU", "cpu")


@dataclass
class EngineEvents:
    sample_rate: float = 1.0
    sample_budget: int | None = None
    tracker: StackDistanceTracker = field(init=False)
    block_size: int = 0
    gpu_missed_blocks: int = 0
    # hash → loaded since stored, in flat arrays (~17 B a block; the tier can hold millions)
    cpu_resident: ResidentBlocks = field(default_factory=ResidentBlocks)
    # GPU-resident block → its parent: bounded by the GPU cache, enough to rebuild prefixes.
    gpu_parent: dict[int, int | None] = field(default_factory=dict)
    cpu_stored_blocks: int = 0
    # Blocks loaded back from the CPU tier, with repeats: what vLLM's load-bytes counter
    # counts (÷ bytes per block), so the two reconcile.
    cpu_loaded_blocks: int = 0
    cpu_evicted_never_loaded_blocks: int = 0
    cpu_evicted_blocks: int = 0
    clears: int = 0
    last_seq: int | None = None
    # The first sequence number seen from the current publisher (vLLM numbers from 0 at each
    # start): the messages before it were published before we listened, and are unseen.
    history_from_seq: int | None = None
    messages: int = 0
    lost_messages: int = 0
    unknown_events: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    # (GPU-missed accesses, first touches among them) each time the accesses doubled: the
    # recent half of the stream is read against the whole to tell a cold start from a
    # steady state (see TargetEvents.first_touch_ratios).
    checkpoints: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tracker = StackDistanceTracker(self.sample_rate, self.sample_budget)

    def _checkpoint(self) -> None:
        h = self.tracker.histogram
        if h.total >= (2 * self.checkpoints[-1][0] if self.checkpoints else 1.0):
            self.checkpoints.append((h.total, h.cold))

    def first_touches_since_half(self) -> tuple[float, float, float, float]:
        """(accesses, first touches) of the whole stream and of its recent part — since the
        last checkpoint at or below half the accesses (between a half and three quarters)."""
        h = self.tracker.histogram
        base = (0.0, 0.0)
        for point in self.checkpoints:
            if point[0] <= h.total / 2:
                base = point
        return h.total, h.cold, h.total - base[0], h.cold - base[1]

    def sequence(self, seq: int) -> int:
        """Account a message's sequence number; returns how many were lost before it.

        A number at or below the last one means the publisher restarted (a vLLM restart
        numbers from 0 again), not a loss."""
        lost = seq - self.last_seq - 1 if self.last_seq is not None and seq > self.last_seq else 0
        if self.last_seq is not None and seq <= self.last_seq:
            # A new publisher: vLLM restarted (it sends no AllBlocksCleared for that), so the
            # GPU cache and the CPU tier are empty again.
            self.clear()
            self.history_from_seq = None
        if self.history_from_seq is None:
            self.history_from_seq = seq
        self.last_seq = seq
        self.lost_messages += lost
        self.messages += 1
        return lost

    def ingest(self, batch: Batch) -> None:
        self.unknown_events += batch.unknown
        self.first_ts = batch.ts if self.first_ts is None else self.first_ts
        self.last_ts = batch.ts
        for ev in batch.events:
            if ev.kind == STORED and ev.medium in GPU_MEDIA:
                if ev.block_size:
                    self.block_size = ev.block_size
                self._gpu_stored(ev.block_hashes, ev.parent_block_hash)
            elif ev.kind == STORED and ev.medium in CPU_MEDIA:
                store = self.cpu_resident.store
                for h in ev.block_hashes:
                    store(h)
                self.cpu_stored_blocks += len(ev.block_hashes)
            elif ev.kind == REMOVED and ev.medium in GPU_MEDIA:
                for h in ev.block_hashes:
                    self.gpu_parent.pop(h, None)
            elif ev.kind == REMOVED and ev.medium in CPU_MEDIA:
                for h in ev.block_hashes:
                    loaded = self.cpu_resident.pop(h)
                    if loaded is not None:
                        self.cpu_evicted_blocks += 1
                        if not loaded:
                            self.cpu_evicted_never_loaded_blocks += 1
            elif ev.kind == CLEARED:
                self.clear()

    def clear(self) -> None:
        """The prefix cache was reset (AllBlocksCleared, a restart): both tiers are empty."""
        self.clears += 1
        self.tracker.reset()
        self.cpu_resident.clear()
        self.gpu_parent.clear()

    def _gpu_stored(self, hashes: tuple[int, ...], parent: int | None) -> None:
        """A request's blocks that missed the GPU (computed, or loaded from the CPU tier).

        vLLM's offloading scheduler looks each new request up in the CPU tier and touches all
        of its blocks — the GPU-hit prefix too — so that the first blocks are the most recent.
        The GPU-hit prefix never shows in events, but it is the chain of the first new block's
        ancestors, which GPU events did show (and which are GPU-resident, so still known).
        Distances are read before the touches: presence is decided at lookup time.
        """
        chain: list[int] = []
        seen: set[int] = set()
        p = parent
        while p is not None and p in self.gpu_parent and p not in seen:  # a loop ends the walk
            chain.append(p)
            seen.add(p)
            p = self.gpu_parent[p]
        chain.reverse()  # root first
        # vLLM loads only the leading run of present blocks: block i is served by a tier of
        # C blocks iff blocks 1..i all are, so the tracker records it at the running maximum
        # distance, then touches the request's blocks (see StackDistanceTracker.lookup).
        self.tracker.lookup(hashes, chain)
        self.gpu_missed_blocks += len(hashes)
        # The same rule says which blocks were really loaded: one still in the CPU tier after
        # the first absent one is recomputed (on the real H200 captures, counting every
        # present block overcounts vLLM's loads by up to 1%; the leading run matches them).
        if len(self.cpu_resident):
            load = self.cpu_resident.load
            for h in hashes:
                if not load(h):  # absent: this block and the rest are recomputed
                    break
                self.cpu_loaded_blocks += 1  # missed on GPU, loaded from the CPU tier
        self._checkpoint()
        prev = parent
        for h in hashes:
            if h != prev:  # a block is never its own parent
                self.gpu_parent[h] = prev
            prev = h

    @property
    def resident_never_loaded_blocks(self) -> int:
        return self.cpu_resident.never_loaded()


class TargetEvents:
    """All DP ranks of one target."""

    def __init__(self, sample_rate: float = 1.0, sample_budget: int | None = None) -> None:
        self.sample_rate = sample_rate
        self.sample_budget = sample_budget
        self.engines: dict[int, EngineEvents] = {}
        self.decode_errors = 0
        self.last_error: str | None = None
        # Fixed at the first value known, so byte counters derived from block counts never
        # go down when a windowed bytes-per-token estimate moves.
        self.bytes_per_block: float | None = None

    def engine(self, rank: int) -> EngineEvents:
        eng = self.engines.get(rank)
        if eng is None:
            eng = EngineEvents(self.sample_rate, self.sample_budget)
            self.engines[rank] = eng
        return eng

    def ingest_message(self, msg: RawMessage) -> bool:
        """Decode one received message and take it in; a payload that does not decode is
        counted and remembered (one line), never raised. Returns whether it was taken."""
        try:
            batch = decode_batch(msg.payload, msg.dp_rank)
        except InputError as exc:
            self.decode_errors += 1
            self.last_error = f"rank {msg.dp_rank} message {msg.seq}: {exc}"
            return False
        self.ingest(batch, msg.seq, msg.dp_rank)
        return True

    def ingest(
        self, batch: Batch, seq: int | None = None, publisher_rank: int | None = None
    ) -> None:
        eng = self.engine(publisher_rank if publisher_rank is not None else batch.dp_rank)
        if seq is not None:
            eng.sequence(seq)
        eng.ingest(batch)

    # -- figures ------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return max((e.block_size for e in self.engines.values()), default=0)

    def missed_tokens_from_events(self) -> float:
        return sum(e.gpu_missed_blocks for e in self.engines.values()) * self.block_size

    @staticmethod
    def _scale(e: EngineEvents) -> float:
        """Sampled counts are estimates: normalise each engine's histogram to the exact number
        of GPU-missed blocks it saw (SHARDS' adjustment), so only the shape is sampled."""
        total = e.tracker.histogram.total
        if not e.tracker.sampled or total <= 0:
            return 1.0
        return e.gpu_missed_blocks / total

    def hit_tokens(self, cpu_bytes_per_engine: float, bytes_per_block: float) -> float:
        """GPU-missed tokens a tier of that size (per engine) would have served."""
        if bytes_per_block <= 0:
            return 0.0
        blocks = cpu_bytes_per_engine / bytes_per_block
        return (
            sum(
                e.tracker.histogram.hits_below(blocks) * self._scale(e)
                for e in self.engines.values()
            )
            * self.block_size
        )

    def histogram_totals(self) -> tuple[float, float]:
        """(all GPU-missed full-block tokens, Σ finite distance × tokens in blocks), with the
        same per-engine normalisation as hit_tokens, so the histogram stays cumulative."""
        total = sum(e.gpu_missed_blocks for e in self.engines.values()) * self.block_size
        finite = (
            sum(e.tracker.histogram.finite_sum * self._scale(e) for e in self.engines.values())
            * self.block_size
        )
        return total, finite

    def achievable_tokens(self) -> float:
        """Every non-cold miss: what an unbounded tier would serve."""
        return (
            sum(
                (e.tracker.histogram.total - e.tracker.histogram.cold) * self._scale(e)
                for e in self.engines.values()
            )
            * self.block_size
        )

    def cpu_resident_blocks(self) -> int:
        return sum(len(e.cpu_resident) for e in self.engines.values())

    def never_loaded_blocks(self) -> tuple[int, int]:
        """(evicted without a load, resident and not loaded yet)."""
        return (
            sum(e.cpu_evicted_never_loaded_blocks for e in self.engines.values()),
            sum(e.resident_never_loaded_blocks for e in self.engines.values()),
        )

    def cpu_loaded_blocks(self) -> int:
        return sum(e.cpu_loaded_blocks for e in self.engines.values())

    def first_touch_ratios(self) -> tuple[float, float] | None:
        """(share of GPU-missed blocks that were first touches over the whole stream, the same
        share over its recent half). A cold start shows as a whole-stream share well above
        the recent one: the curve's hit ratios still rise as the stream goes on. None before
        any access."""
        parts = [e.first_touches_since_half() for e in self.engines.values()]
        total, cold = sum(p[0] for p in parts), sum(p[1] for p in parts)
        recent_total, recent_cold = sum(p[2] for p in parts), sum(p[3] for p in parts)
        if total <= 0 or recent_total <= 0:
            return None
        return cold / total, recent_cold / recent_total

    def lost_messages(self) -> int:
        return sum(e.lost_messages for e in self.engines.values())

    def unseen_before_start(self) -> int:
        """Messages the current publishers sent before the first one we have: history the curve
        does not contain (0 when every engine's stream was seen from its first message)."""
        return sum(e.history_from_seq or 0 for e in self.engines.values())

    def messages(self) -> int:
        return sum(e.messages for e in self.engines.values())

    def tracked_blocks(self) -> int:
        """Blocks the reuse-distance trackers hold, on the engine that holds the fewest."""
        return min((e.tracker.tracked for e in self.engines.values()), default=0)

    def sample_rate_now(self) -> float:
        return min((e.tracker.rate for e in self.engines.values()), default=self.sample_rate)
