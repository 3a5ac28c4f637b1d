"""Workloads: which prompts arrive when, deterministic for a seed.

A prompt is a tuple of segments `(segment_id, tokens)`: system prompt, document, question.
Token ids are never built: shared segments give shared block hashes, as in vLLM."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

Segments = tuple[tuple[int, int], ...]

SYSTEM_SEGMENT_ID = 1
_DOC_BASE = 1_000
_UNIQUE_DOC_BASE = 500_000_000
_QUESTION_BASE = 1_000_000_000
# Ids a period allocates stay below this stride (a period would need 10^9 sessions or
# questions to overlap the next), so the ids of period k are `k * stride + id`.
_PERIOD_ID_STRIDE = 1 << 40


@dataclass(frozen=True)
class Workload:
    """Traffic of one served model: a kind of reuse, an arrival process, prompt lengths.

    Scenarios differ mostly here; docs/scenarios.md ("Workloads") describes each kind."""

    # "documents": questions about a library of `num_docs`, drawn by `popularity`.
    # "sessions": each document asked `reuses` more times, gaps of mean `reuse_gap_s`.
    # "batches": `batch` repeated `num_batches` times, fresh documents in each.
    kind: str = "documents"
    rate_rps: float = 1.0  # sessions: new documents arrive at rate_rps / (1 + reuses)
    arrival: str = "poisson"  # "poisson" | "uniform"
    num_docs: int = 20
    doc_tokens: tuple[int, int] = (1500, 2500)
    popularity: str = "zipf"  # "uniform" | "zipf"
    zipf_alpha: float = 1.0
    question_tokens: tuple[int, int] = (20, 80)
    system_tokens: int = 0
    unique_fraction: float = 0.0  # share of requests that bring a brand-new document
    rotate_every_s: float | None = None  # replace the whole library this often
    reuses: int = 3
    reuse_gap_s: float = 60.0  # the reuse distance, exponential
    # (label, prompt key, prompt tokens); equal keys in a batch are the same prompt (the
    # article's A, A, B, C, A).
    batch: tuple[tuple[str, str, int], ...] = ()
    num_batches: int | None = None  # None: until the duration
    request_interval_s: float = 0.3
    output_tokens: int = 1  # vLLM's max_tokens; 1 = prefill only
    # A closed loop like a benchmark client: `concurrency` clients each send their next request
    # `think_s` after the last completes, `requests` in all, in the open-loop order.
    concurrency: int | None = None
    requests: int | None = None
    think_s: float = 0.0


@dataclass(frozen=True)
class RequestSpec:
    """One request as the client sends it (before any server-side state)."""

    t: float  # arrival at the API server, virtual seconds
    segments: Segments
    label: str
    route_key: int  # what a prefix-aware router would hash (the document)
    output_tokens: int = 1

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.segments)


def _fit(segments: list[tuple[int, int]], max_tokens: int) -> Segments:
    """Trim the tail so the prompt fits max_model_len - 1 (max_tokens=1 needs one slot)."""
    out: list[tuple[int, int]] = []
    room = max_tokens
    for seg_id, n in segments:
        if room <= 0:
            break
        take = min(n, room)
        if take > 0:
            out.append((seg_id, take))
            room -= take
    return tuple(out)


def _arrivals(rng: random.Random, rate: float, duration: float, kind: str) -> list[float]:
    if rate <= 0:
        return []
    times: list[float] = []
    if kind == "uniform":
        step = 1.0 / rate
        t = step / 2
        while t < duration:
            times.append(t)
            t += step
        return times
    t = rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _doc_len(seed: int, doc_id: int, bounds: tuple[int, int]) -> int:
    # Each document has one fixed length whatever order it is first drawn in.
    return random.Random(seed * 1_000_003 + doc_id).randint(bounds[0], bounds[1])


def generate(
    workload: Workload,
    duration_s: float,
    seed: int,
    max_prompt_tokens: int,
    period: int = 0,
    spill: bool = False,
) -> list[RequestSpec]:
    """The requests of one period, [k·duration_s, (k+1)·duration_s), sorted by arrival time.

    An endless simulator asks period by period, each with its own random stream and fresh ids.
    Period 0 is the scenario's run; `spill` keeps a session's re-sends past the period's end."""
    # The library and its rotation (by absolute time) carry over periods, so no period replays
    # or forgets another; a closed-loop workload (`requests`) is one batch per period.
    if period < 0:
        raise ValueError("period must be >= 0")
    # Ids of things that are new in every period live in a range of their own per period.
    fresh = period * _PERIOD_ID_STRIDE
    draw = _Draw(
        workload,
        duration_s,
        seed,
        max_prompt_tokens,
        random.Random(seed if period == 0 else f"{seed}/{period}"),
        period * duration_s,
        fresh,
        itertools.count(_QUESTION_BASE + fresh),
        [(SYSTEM_SEGMENT_ID, workload.system_tokens)] if workload.system_tokens > 0 else [],
    )
    if workload.kind == "documents":
        out = _documents(draw)
    elif workload.kind == "sessions":
        out = _sessions(draw, spill)
    elif workload.kind == "batches":
        out = _batches(draw)
    else:
        raise ValueError(f"unknown workload kind {workload.kind!r}")
    if workload.output_tokens > 1:
        out = [replace(r, output_tokens=workload.output_tokens) for r in out]
    if draw.offset:
        out = [replace(r, t=r.t + draw.offset) for r in out]
    out.sort(key=lambda r: r.t)
    return out


@dataclass
class _Draw:
    """What one period's requests are drawn with.

    Its random stream, range of fresh ids, question ids and the shared system prompt."""

    workload: Workload
    duration_s: float
    seed: int
    max_prompt_tokens: int
    rng: random.Random
    offset: float
    fresh: int
    questions: Iterator[int]
    system: list[tuple[int, int]]

    def question(self) -> tuple[int, int]:
        lo, hi = self.workload.question_tokens
        return (next(self.questions), self.rng.randint(lo, hi))

    def document(self, doc_id: int) -> tuple[int, int]:
        return (doc_id, _doc_len(self.seed, doc_id, self.workload.doc_tokens))

    def prompt(self, *segments: tuple[int, int]) -> Segments:
        return _fit([*self.system, *segments], self.max_prompt_tokens)


def _documents(draw: _Draw) -> list[RequestSpec]:
    """ "documents": each request a new question about a library document (or a unique one)."""
    workload, rng = draw.workload, draw.rng
    n = max(1, workload.num_docs)
    if workload.popularity == "zipf":
        weights = [1.0 / math.pow(rank + 1, workload.zipf_alpha) for rank in range(n)]
    else:
        weights = [1.0] * n
    cum = list(itertools.accumulate(weights))
    unique_ids = itertools.count(_UNIQUE_DOC_BASE + draw.fresh)
    times = (
        _arrivals(rng, workload.rate_rps, draw.duration_s, workload.arrival)
        if workload.requests is None
        else [0.0] * workload.requests
    )
    out: list[RequestSpec] = []
    for t in times:
        if workload.unique_fraction > 0 and rng.random() < workload.unique_fraction:
            doc_id = next(unique_ids)
        else:
            idx = bisect.bisect_left(cum, rng.random() * cum[-1])
            generation = (
                int((draw.offset + t) // workload.rotate_every_s) if workload.rotate_every_s else 0
            )
            doc_id = _DOC_BASE + generation * n + min(idx, n - 1)
        segs = draw.prompt(draw.document(doc_id), draw.question())
        out.append(RequestSpec(t=t, segments=segs, label="doc", route_key=doc_id))
    return out


def _sessions(draw: _Draw, spill: bool) -> list[RequestSpec]:
    """ "sessions": a new document, then asked about again `reuses` times."""
    workload, rng = draw.workload, draw.rng
    per_session = 1 + max(0, workload.reuses)
    session_rate = workload.rate_rps / per_session
    out: list[RequestSpec] = []
    for i, t0 in enumerate(_arrivals(rng, session_rate, draw.duration_s, workload.arrival)):
        doc_id = _DOC_BASE + draw.fresh + i
        doc = draw.document(doc_id)
        t = t0
        for turn in range(per_session):
            if turn:
                t += rng.expovariate(1.0 / workload.reuse_gap_s)
            if t >= draw.duration_s and not spill:
                break
            segs = draw.prompt(doc, draw.question())
            label = "first" if turn == 0 else "reuse"
            out.append(RequestSpec(t=t, segments=segs, label=label, route_key=doc_id))
    return out


def _batches(draw: _Draw) -> list[RequestSpec]:
    """ "batches": the explicit sequence again and again, each batch on fresh documents."""
    workload = draw.workload
    out: list[RequestSpec] = []
    t = workload.request_interval_s
    for b in itertools.count():
        if workload.num_batches is not None and b >= workload.num_batches:
            break
        if t >= draw.duration_s or not workload.batch:
            break
        keys: dict[str, int] = {}
        for label, key, tokens in workload.batch:
            doc_id = keys.setdefault(key, _DOC_BASE + draw.fresh + b * 100 + len(keys))
            segs = draw.prompt((doc_id, tokens))
            out.append(RequestSpec(t=t, segments=segs, label=label, route_key=doc_id))
            t += workload.request_interval_s
    return out


# (hashes of the full blocks so far, last parent hash, (segment, start, end) pieces of the
# partial block being filled)
_HashState = tuple[tuple[int, ...], int, tuple[tuple[int, int, int], ...]]


class PromptHasher:
    """Chain hashes of a prompt's full blocks, memoised per shared prefix.

    Two prompts share a block hash exactly when they share every token to its end, as in vLLM."""

    # hash_i = hash((hash_{i-1}, pieces of block i)), a piece being (segment_id, start, end);
    # Python's hash of int tuples does not depend on PYTHONHASHSEED, so runs repeat.

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._memo: dict[Segments, _HashState] = {}

    def _extend(self, state: _HashState, segment: tuple[int, int]) -> _HashState:
        """Append one segment to (full-block hashes, last parent hash, partial-block pieces)."""
        hashes, parent, pending = state
        hashes_l = list(hashes)
        pend = list(pending)
        filled = sum(e - s for _, s, e in pend)
        seg_id, n = segment
        pos = 0
        bs = self.block_size
        while pos < n:
            take = min(bs - filled, n - pos)
            pend.append((seg_id, pos, pos + take))
            pos += take
            filled += take
            if filled == bs:
                parent = hash((parent, tuple(pend)))
                hashes_l.append(parent)
                pend = []
                filled = 0
        return tuple(hashes_l), parent, tuple(pend)

    def _prefix_state(self, segments: Segments) -> _HashState:
        if not segments:
            return (), 0, ()
        hit = self._memo.get(segments)
        if hit is not None:
            return hit
        state = self._extend(self._prefix_state(segments[:-1]), segments[-1])
        if len(self._memo) > 200_000:  # bound memory on very long runs
            self._memo.clear()
        self._memo[segments] = state
        return state

    def block_hashes(self, segments: Segments) -> tuple[int, ...]:
        """Hashes of every full block.

        Proper prefixes (system, system+document) are memoised so shared documents hash once; the
        full prompt is not kept."""
        if not segments:
            return ()
        return self._extend(self._prefix_state(segments[:-1]), segments[-1])[0]
