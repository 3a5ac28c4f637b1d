"""What one target's KV-event stream says: reuse distances, CPU occupancy, true waste.

One `EngineEvents` per DP rank, since each engine has its own CPU tier. One budget
(`--kv-events-sample-budget`) bounds its memory; docs/sizing.md §3 says what each event feeds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from kvoffload.errors import InputError
from kvoffload.kvevents.blockindex import UPKEEP_PIECE, ResidentBlocks
from kvoffload.kvevents.decode import CLEARED, REMOVED, STORED, Batch, decode_batch
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.stackdist import StackDistanceTracker

GPU_MEDIA = (None, "GPU", "gpu", "cuda")
CPU_MEDIA = ("CPU", "cpu")

# Sequence numbers: vLLM numbers each publisher's messages from 0, one per scheduler step with
# events (at most thousands a second). A number at or above SEQUENCE_LIMIT (35 years at 1,000
# messages a second) is rejected like a negative one: it could only make the gap and history
# figures absurd (2^63 gave 9.2e18 lost messages). A forward gap larger than GAP_SLACK +
# GAP_PER_SECOND × the seconds since the previous message (GAP_FALLBACK when that time is not
# known) cannot be messages lost: it is flagged (`sequence_jumps`) and the stream goes on
# from the new number, with the state kept.
SEQUENCE_LIMIT = 1 << 40
GAP_SLACK = 1 << 20
GAP_PER_SECOND = 100_000
GAP_FALLBACK = 1 << 32

# vLLM touches a request's GPU-hit prefix (the chain of the parent's ancestors) in the CPU tier;
# each touch moves a block in the LRU stack, so a chain of d blocks costs O(d) however it is
# walked. A request's prefix is bounded by the model's context, a hostile chain is not (a 200k
# chain cost 0.65-3 s per 1-block event): each event may walk and touch at most an allowance
# of ancestors, earned per event, per new block and per second of arrival time (the receive
# time, not the publisher's stamp) and saved up to PREFIX_ALLOWANCE_MAX, so the work per event
# is O(1) amortised: 64 + 16 per new block, plus at most 20,000 touches a second (~70 ms of a
# core), beyond the saved allowance. Real streams stay far inside it (the H200 captures: at
# most 68 ancestors an event, 8 per new block on average; a 100k-token agent context is
# ~6,000) and give the same figures; a walk that is cut is counted (`prefix_walks_cut`): the
# farther ancestors keep their place in the stack.
PREFIX_ALLOWANCE_PER_EVENT = 64
PREFIX_ALLOWANCE_PER_BLOCK = 16
PREFIX_ALLOWANCE_PER_SECOND = 20_000
PREFIX_ALLOWANCE_MAX = 1 << 16

# vLLM's block sizes are 1 to a few hundred tokens; a BlockStored claiming more than
# MAX_BLOCK_SIZE (or a negative one) is refused, counted (`refused_events`), so that it never
# scales a token figure (9.2e20 and -3,200 reached /metrics). 0 means "not given".
MAX_BLOCK_SIZE = 1 << 20
# A message's work is done in steps of at most STEP_BLOCKS blocks, the event loop getting a
# turn between them (a 4 MiB batch holds ~450k hashes: seconds of work). An event with more
# blocks is taken in pieces: the pieces after the first walk no prefix (the first piece is
# it) and their distances restart the running maximum; no real event comes near (a 100k-token
# context is ~6,000 blocks).
STEP_BLOCKS = 8192
# Chain tails kept to tell decode blocks (EngineEvents._is_decode_block): one per request in
# flight is enough (vLLM's max_num_seqs is at most a few thousand); past it the oldest half goes.
MAX_CHAIN_TAILS = 1 << 16


class ParentMap(dict[int, int | None]):
    """GPU block → its parent (None for a first block), at most `limit` blocks.

    A dict, so a chain walk costs one C-level lookup a step (docs/performance.md). Past the limit
    the oldest eighth goes at once, so a publisher that never sends BlockRemoved cannot grow it.
    """

    __slots__ = ("evicted", "limit", "trimmed")

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.evicted = 0
        # Entries deleted in place since the dict was last rebuilt: a dict does not reuse
        # their room, and left alone it would resize to twice the table (40 → 80 MB at 1M).
        self.trimmed = 0

    def trim(self) -> None:
        limit = self.limit
        if limit is not None and len(self) > limit:
            drop = len(self) - limit + limit // 8  # an eighth more: amortised O(1) a store
            # insertion order: the oldest first; deleted by C-level calls (a rebuild here
            # was 0.45 s at 1M blocks, the event loop held); `rebuilt` compacts later
            deque(map(self.__delitem__, list(islice(self, drop))), maxlen=0)
            self.evicted += drop
            self.trimmed += drop

    def rebuilt_steps(self) -> Generator[None, None, ParentMap]:
        """A compact copy (same entries, same order), built in pieces.

        Nothing may change the map meanwhile.
        """
        new = ParentMap(self.limit)
        new.evicted = self.evicted
        items = iter(self.items())
        while len(new) < len(self):
            yield
            new.update(islice(items, UPKEEP_PIECE))
        return new


def _at_once(steps: Generator[None, None, ParentMap]) -> ParentMap:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


# GPU BlockStored blocks are exactly the GPU misses and feed the tracker; CPU BlockStored and
# BlockRemoved give the tier's occupancy and, joined with later misses, the blocks loaded back.
# At the budget the tracker samples less and the parent map and residency forget their oldest.
@dataclass
class EngineEvents:
    sample_rate: float = 1.0
    sample_budget: int | None = None
    # False: the O(n) upkeep is done at once when needed, the event loop held meanwhile (the
    # way before #25, kept as bench/kvevents_ingest.py's reference; the same figures)
    upkeep_ahead: bool = True
    tracker: StackDistanceTracker = field(init=False)
    block_size: int = 0
    gpu_missed_blocks: int = 0
    # hash → loaded since stored, in flat arrays (~30 B a block; the tier can hold millions),
    # at most sample_budget blocks (the oldest stored forgotten first)
    cpu_resident: ResidentBlocks = field(init=False)
    # GPU-resident block → its parent: bounded by the GPU cache while vLLM sends BlockRemoved,
    # and by sample_budget whatever it sends; enough to rebuild prefixes.
    gpu_parent: ParentMap = field(init=False)
    cpu_stored_blocks: int = 0
    # Blocks the tiers below the CPU tier report stored (vLLM's fs tier with enable_kv_events:
    # medium "FS", never removed): what the tier-below what-if predicts it writes.
    tier_stored_blocks: int = 0
    # GPU blocks filled by decoding (see _is_decode_block): GPU-cached, never offloaded
    decode_blocks: int = 0
    # the last block of each recent GPU run (insertion order = age), to tell decode blocks
    chain_tails: dict[int, None] = field(default_factory=dict)
    # Simulated tiers (kvevents.whatif.TierSim) handed every lookup the tracker gets: the live
    # sidecar's what-ifs. Duck-typed (request, reset) so this module needs no whatif import.
    lookup_listeners: list[Any] = field(default_factory=list)
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
    # forward gaps too large to be losses (see GAP_SLACK), and sequence numbers rejected
    sequence_jumps: int = 0
    sequence_rejected: int = 0
    # GPU-hit prefixes whose walk stopped at the allowance (see PREFIX_ALLOWANCE_MAX)
    prefix_walks_cut: int = 0
    # the sequence went back: a new publisher (vLLM restarted)
    publisher_restarts: int = 0
    # events not taken, by reason (block_size: out of 0..MAX_BLOCK_SIZE)
    refused_events: dict[str, int] = field(default_factory=dict)
    # receive time of the previous message (not saved: a resumed state uses GAP_FALLBACK)
    last_received: float | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    # (GPU-missed accesses, first touches among them) each time the accesses doubled: the
    # recent half of the stream is read against the whole to tell a cold start from a
    # steady state (see TargetEvents.first_touch_ratios).
    checkpoints: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tracker = StackDistanceTracker(self.sample_rate, self.sample_budget)
        self.cpu_resident = ResidentBlocks(self.sample_budget)
        self.gpu_parent = ParentMap(self.sample_budget)
        self._prefix_allowance = float(PREFIX_ALLOWANCE_MAX)
        self._allowance_at: float | None = None  # receive time it was last topped up at
        self._in_upkeep = False

    def upkeep(self) -> Iterator[None]:
        """The O(n) upkeep the next step could need, done now in pieces, between steps.

        Why: the event loop keeps turning; another message for this engine waits for it.
        """
        # Table doubling, the blocks to drop at the budget, compaction, the parent map's rebuild.
        if not self.upkeep_ahead:
            if self.gpu_parent.trimmed:
                self.gpu_parent = _at_once(self.gpu_parent.rebuilt_steps())
            return
        while self._in_upkeep:
            yield
        self._in_upkeep = True
        try:
            yield from self.tracker.upkeep()
            yield from self.cpu_resident.upkeep()
            if self.gpu_parent.trimmed:
                self.gpu_parent = yield from self.gpu_parent.rebuilt_steps()
        finally:
            self._in_upkeep = False

    def _pause(self) -> Iterator[None]:
        """Between two steps: a turn for the event loop, then the upkeep the next one needs."""
        yield
        yield from self.upkeep()

    @property
    def evicted_blocks(self) -> dict[str, int]:
        """Blocks forgotten to stay within the budget, by structure (the tracker's show as a
        lower sampling rate instead)."""
        return {"gpu_parents": self.gpu_parent.evicted, "cpu_resident": self.cpu_resident.evicted}

    def _checkpoint(self) -> None:
        h = self.tracker.histogram
        if h.total >= (2 * self.checkpoints[-1][0] if self.checkpoints else 1.0):
            self.checkpoints.append((h.total, h.cold))

    def first_touches_since_half(self) -> tuple[float, float, float, float]:
        """(accesses, first touches) of the whole stream and of its recent part.

        The recent part starts at the last checkpoint at or below half the accesses.
        """
        h = self.tracker.histogram
        base = (0.0, 0.0)
        for point in self.checkpoints:
            if point[0] <= h.total / 2:
                base = point
        return h.total, h.cold, h.total - base[0], h.cold - base[1]

    def sequence(self, seq: int, received: float | None = None) -> int:
        """Account a message's sequence number; returns how many were lost before it.

        Its `received` time tells a gap from a jump. A gap larger than any publisher could have
        made is flagged, not lost. A number at or below the last is a restart, not a loss.
        """
        lost = seq - self.last_seq - 1 if self.last_seq is not None and seq > self.last_seq else 0
        if lost:
            if received is not None and self.last_received is not None:
                plausible = GAP_SLACK + GAP_PER_SECOND * max(0.0, received - self.last_received)
            else:
                plausible = GAP_FALLBACK
            if lost > plausible:
                self.sequence_jumps += 1
                lost = 0
        if received is not None:
            self.last_received = received
        if self.last_seq is not None and seq <= self.last_seq:
            # A new publisher: vLLM restarted (it sends no AllBlocksCleared for that), so the
            # GPU cache and the CPU tier are empty again.
            self.publisher_restarts += 1
            self.clear()
            self.history_from_seq = None
        if self.history_from_seq is None:
            self.history_from_seq = seq
        self.last_seq = seq
        self.lost_messages += lost
        self.messages += 1
        return lost

    def ingest(self, batch: Batch, received: float | None = None) -> None:
        for _ in self.ingest_steps(batch, received):
            pass

    def ingest_steps(self, batch: Batch, received: float | None = None) -> Iterator[None]:
        """Take in a batch, yielding after each STEP_BLOCKS blocks of work."""
        if received is not None:
            if self._allowance_at is not None and received > self._allowance_at:
                earned = PREFIX_ALLOWANCE_PER_SECOND * (received - self._allowance_at)
                self._prefix_allowance = min(PREFIX_ALLOWANCE_MAX, self._prefix_allowance + earned)
            self._allowance_at = received
        yield from self.upkeep()
        self.unknown_events += batch.unknown
        self.first_ts = batch.ts if self.first_ts is None else self.first_ts
        self.last_ts = batch.ts
        work = 0
        for ev in batch.events:
            if work >= STEP_BLOCKS:
                yield from self._pause()
                work = 0
            work += len(ev.block_hashes) + 1
            if ev.kind == STORED and not 0 <= ev.block_size <= MAX_BLOCK_SIZE:
                self.refused_events["block_size"] = self.refused_events.get("block_size", 0) + 1
            elif ev.kind == STORED and ev.medium in GPU_MEDIA:
                if ev.block_size:
                    self.block_size = ev.block_size
                hashes = ev.block_hashes
                if self._is_decode_block(hashes, ev.parent_block_hash):
                    self._gpu_decoded(hashes[0], ev.parent_block_hash)
                    continue
                self._note_tail(hashes[-1] if hashes else None, ev.parent_block_hash)
                if len(hashes) <= STEP_BLOCKS:
                    self._gpu_stored(hashes, ev.parent_block_hash)
                    continue
                loading = self._gpu_stored(hashes[:STEP_BLOCKS], ev.parent_block_hash)
                for at in range(STEP_BLOCKS, len(hashes), STEP_BLOCKS):
                    yield from self._pause()
                    piece = hashes[at : at + STEP_BLOCKS]
                    loading = self._gpu_stored(piece, hashes[at - 1], True, loading)
                work = 0
            elif ev.kind == STORED and ev.medium in CPU_MEDIA:
                store = self.cpu_resident.store
                for h in ev.block_hashes:
                    store(h)
                self.cpu_stored_blocks += len(ev.block_hashes)
            elif ev.kind == STORED:
                self.tier_stored_blocks += len(ev.block_hashes)
            elif ev.kind == REMOVED and ev.medium in GPU_MEDIA:
                pop = self.gpu_parent.pop
                tails = self.chain_tails
                for h in ev.block_hashes:
                    pop(h, None)
                    tails.pop(h, None)
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
        for listener in self.lookup_listeners:
            listener.reset()
        self.cpu_resident.clear()
        self.gpu_parent.clear()
        self.chain_tails.clear()

    def _is_decode_block(self, hashes: tuple[int, ...], parent: int | None) -> bool:
        """A block that decoding filled: one block extending the last block of an earlier run.

        Why: vLLM offloads prompt blocks only (`offload_prompt_only`). The real tier never holds
        such a block, so the replayed one must not either.
        """
        return len(hashes) == 1 and parent is not None and parent in self.chain_tails

    def _gpu_decoded(self, block: int, parent: int | None) -> None:
        """A decode block: GPU-resident (a later prompt's prefix may run through it), no lookup."""
        self.decode_blocks += 1
        self._note_tail(block, parent)
        if block != parent:
            self.gpu_parent[block] = parent
            if self.gpu_parent.limit is not None and len(self.gpu_parent) > self.gpu_parent.limit:
                self.gpu_parent.trim()

    def _note_tail(self, tail: int | None, parent: int | None) -> None:
        """The run's last block is now a chain's tail, and its parent no longer is."""
        tails = self.chain_tails
        if parent is not None:
            tails.pop(parent, None)
        if tail is not None:
            tails[tail] = None
            if len(tails) > MAX_CHAIN_TAILS:  # requests that ended long ago: drop the oldest half
                for old in list(tails)[: MAX_CHAIN_TAILS // 2]:
                    del tails[old]

    def _gpu_stored(
        self,
        hashes: tuple[int, ...],
        parent: int | None,
        continued: bool = False,
        loading: bool = True,
    ) -> bool:
        """Take in a request's GPU-missed blocks; returns whether all were loaded from the CPU tier.

        `continued`: a later piece of a long event (STEP_BLOCKS), its prefix the pieces before.
        `loading`: whether those were all loaded.
        """
        # vLLM looks a request up, then touches all its blocks, the GPU-hit prefix too: that
        # prefix is the chain of the first new block's ancestors. Distances are read before the
        # touches, since presence is decided at lookup time.
        allowance = min(
            PREFIX_ALLOWANCE_MAX,
            self._prefix_allowance
            + PREFIX_ALLOWANCE_PER_EVENT
            + PREFIX_ALLOWANCE_PER_BLOCK * len(hashes),
        )
        parents = self.gpu_parent
        chain: list[int] = []
        seen: set[int] = set()
        p = None if continued else parent
        while p is not None and p in parents and p not in seen:  # a loop ends the walk
            if len(chain) >= allowance:
                self.prefix_walks_cut += 1
                break
            chain.append(p)
            seen.add(p)
            p = parents[p]
        self._prefix_allowance = allowance - len(chain)
        chain.reverse()  # root first
        # vLLM loads only the leading run of present blocks: block i is served by a tier of
        # C blocks iff blocks 1..i all are, so the tracker records it at the running maximum
        # distance, then touches the request's blocks (see StackDistanceTracker.lookup).
        self.tracker.lookup(hashes, chain)
        for listener in self.lookup_listeners:
            listener.request(hashes, chain)
        self.gpu_missed_blocks += len(hashes)
        # The same rule says which blocks were really loaded: one still in the CPU tier after
        # the first absent one is recomputed (on the real H200 captures, counting every
        # present block overcounts vLLM's loads by up to 1%; the leading run matches them).
        if loading and len(self.cpu_resident):
            load = self.cpu_resident.load
            for h in hashes:
                if not load(h):  # absent: this block and the rest are recomputed
                    loading = False
                    break
                self.cpu_loaded_blocks += 1  # missed on GPU, loaded from the CPU tier
        else:
            loading = False
        self._checkpoint()
        prev = parent
        for h in hashes:
            if h != prev:  # a block is never its own parent
                parents[h] = prev
            prev = h
        if parents.limit is not None and len(parents) > parents.limit:
            parents.trim()
        return loading

    @property
    def resident_never_loaded_blocks(self) -> int:
        return self.cpu_resident.never_loaded()


class TargetEvents:
    """All DP ranks of one target."""

    def __init__(
        self, sample_rate: float = 1.0, sample_budget: int | None = None, upkeep_ahead: bool = True
    ) -> None:
        self.sample_rate = sample_rate
        self.sample_budget = sample_budget
        self.upkeep_ahead = upkeep_ahead
        # What a new engine's lookups are also handed to (kvevents.whatif.LiveWhatIf), by rank.
        self.listeners_for: Callable[[int], list[Any]] | None = None
        self.engines: dict[int, EngineEvents] = {}
        self.decode_errors = 0
        self.last_error: str | None = None
        # Fixed at the first value known, so byte counters derived from block counts never
        # go down when a windowed bytes-per-token estimate moves.
        self.bytes_per_block: float | None = None

    def engine(self, rank: int) -> EngineEvents:
        eng = self.engines.get(rank)
        if eng is None:
            eng = EngineEvents(self.sample_rate, self.sample_budget, self.upkeep_ahead)
            if self.listeners_for is not None:
                eng.lookup_listeners = self.listeners_for(rank)
            self.engines[rank] = eng
        return eng

    def ingest_message(self, msg: RawMessage) -> bool:
        """Decode one received message and take it in; returns whether it was taken.

        A payload that does not decode is counted and remembered (one line), never raised.
        """
        steps = self.ingest_message_steps(msg)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return bool(done.value)

    def ingest_message_steps(self, msg: RawMessage) -> Generator[None, None, bool]:
        """ingest_message in steps of bounded work (EngineEvents.ingest_steps): the caller
        gives the event loop a turn between them. Returns (StopIteration) whether taken."""
        try:
            batch = decode_batch(msg.payload, msg.dp_rank)
        except InputError as exc:
            self.decode_errors += 1
            self.last_error = f"rank {msg.dp_rank} message {msg.seq}: {exc}"
            return False
        yield  # decoding a big batch is work too
        yield from self.engine(msg.dp_rank).upkeep()  # before its sequence number changes anything
        eng = self._placed(batch, msg.seq, msg.dp_rank, msg.received_at)
        if eng is None:
            return False
        yield from eng.ingest_steps(batch, msg.received_at)
        return True

    def ingest(
        self,
        batch: Batch,
        seq: int | None = None,
        publisher_rank: int | None = None,
        received: float | None = None,
    ) -> bool:
        """Take in a decoded batch; False (counted, nothing changed) when its sequence number
        is out of range."""
        eng = self._placed(batch, seq, publisher_rank, received)
        if eng is None:
            return False
        eng.ingest(batch, received)
        return True

    def _placed(
        self, batch: Batch, seq: int | None, publisher_rank: int | None, received: float | None
    ) -> EngineEvents | None:
        """The engine a batch goes to, its sequence number accounted; None when rejected."""
        rank = publisher_rank if publisher_rank is not None else batch.dp_rank
        eng = self.engine(rank)
        if seq is not None:
            if not 0 <= seq < SEQUENCE_LIMIT:
                self.reject_sequence(rank, seq)
                return None
            eng.sequence(seq, received)
        return eng

    def reject_sequence(self, rank: int, seq: int) -> None:
        """A message of `rank` whose sequence number is out of range: counted, not taken."""
        self.engine(rank).sequence_rejected += 1
        self.last_error = f"rank {rank} message {seq}: sequence number out of range"

    # -- figures ------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return max((e.block_size for e in self.engines.values()), default=0)

    def missed_tokens_from_events(self) -> float:
        return sum(e.gpu_missed_blocks for e in self.engines.values()) * self.block_size

    @staticmethod
    def _scale(e: EngineEvents) -> float:
        """Normalise each engine's histogram to its exact GPU-missed block count (SHARDS).

        Why: sampled counts are estimates, and this way only the shape is sampled.
        """
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
        """(all GPU-missed full-block tokens, Σ finite distance × tokens), normalised as hit_tokens.

        Why: the histogram then stays cumulative.
        """
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

    def tier_stored_blocks(self) -> int:
        return sum(e.tier_stored_blocks for e in self.engines.values())

    def first_touch_ratios(self) -> tuple[float, float] | None:
        """(first-touch share of GPU-missed blocks over the whole stream, over its recent half).

        A cold start shows as a whole-stream share well above the recent one. None before any
        access.
        """
        parts = [e.first_touches_since_half() for e in self.engines.values()]
        total, cold = sum(p[0] for p in parts), sum(p[1] for p in parts)
        recent_total, recent_cold = sum(p[2] for p in parts), sum(p[3] for p in parts)
        if total <= 0 or recent_total <= 0:
            return None
        return cold / total, recent_cold / recent_total

    def lost_messages(self) -> int:
        return sum(e.lost_messages for e in self.engines.values())

    def evicted_blocks(self) -> dict[str, int]:
        """Blocks forgotten to stay within the budget, by structure, over all engines."""
        out = {"gpu_parents": 0, "cpu_resident": 0}
        for e in self.engines.values():
            for kind, n in e.evicted_blocks.items():
                out[kind] += n
        return out

    def sequence_anomalies(self) -> dict[str, int]:
        """Messages with a sequence number out of range (rejected) or jumping too far (flagged)."""
        return {
            "rejected": sum(e.sequence_rejected for e in self.engines.values()),
            "jump": sum(e.sequence_jumps for e in self.engines.values()),
        }

    def publisher_restarts(self) -> int:
        return sum(e.publisher_restarts for e in self.engines.values())

    def refused_events(self) -> dict[str, int]:
        """Events not taken, by reason, over all engines."""
        out = {"block_size": 0}
        for e in self.engines.values():
            for reason, n in e.refused_events.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def prefix_walks_cut(self) -> int:
        return sum(e.prefix_walks_cut for e in self.engines.values())

    def unseen_before_start(self) -> int:
        """Messages the publishers sent before the first one we have (0 when all were seen)."""
        return sum(e.history_from_seq or 0 for e in self.engines.values())

    def messages(self) -> int:
        return sum(e.messages for e in self.engines.values())

    def tracked_blocks(self) -> int:
        """Blocks the reuse-distance trackers hold, on the engine that holds the fewest."""
        return min((e.tracker.tracked for e in self.engines.values()), default=0)

    def sample_rate_now(self) -> float:
        return min((e.tracker.rate for e in self.engines.values()), default=self.sample_rate)
