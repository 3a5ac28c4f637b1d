"""SimServer: one simulated vLLM process on a virtual clock, deterministic for a seed.

Time moves only when asked (advance_to), so an hour of traffic runs in seconds.
Its two clocks and endless runs: docs/scenarios.md ("Serving")."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest

from . import vllm_families as mf
from .config import Scenario, Sizing, validate
from .engine import Engine, EngineTruth, Request
from .workload import PromptHasher, RequestSpec, generate

if TYPE_CHECKING:
    from .kv_events import KvEventLog


# Per-request records an endless run keeps for /ground-truth (the newest); totals and means
# cover every request whatever the cap.
ENDLESS_RECORDS = 10_000


# The primary model's figures that ground_truth also puts at its top level.
_PRIMARY_KEYS = (
    "true_offload_hit_ratio",
    "loaded_bytes",
    "stored_bytes",
    "loaded_tokens",
    "gpu_missed_tokens",
    "never_reloaded_evicted_bytes",
    "never_reloaded_resident_bytes",
    "never_reloaded_bytes",
    "mean_ttft_s",
    "store_failures",
    "stores_skipped",
    "ttft_saved_s",
)


class SimServer:
    """One simulated vLLM process: event queue, engines per model and rank, metrics, ground truth.

    Tests and `kvoffload sim` drive it in place of a GPU, knowing what /metrics cannot show."""

    # `kv_events=True` records the primary model's KV events (off: nothing is built).
    # `endless=True` keeps traffic coming past the scenario's length, period after period.
    # `epoch`/`time_scale` set the reporting clock: wall_time(t) = epoch + t * time_scale,
    # the scenario's calendar by default, `wall_clock(speed)` for a sped-up server.

    def __init__(
        self,
        scenario: Scenario,
        seed: int = 0,
        kv_events: bool = False,
        *,
        endless: bool = False,
        epoch: float | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.scenario = scenario
        self.seed = seed
        self.epoch = scenario.start_epoch if epoch is None else epoch
        self.time_scale = time_scale
        # A caller-given clock (a server next to real scrapers) rather than the scenario's
        # calendar: the HTTP app may re-anchor `epoch`, so KV events keep t until drained.
        self.mapped_clock = epoch is not None or time_scale != 1.0
        self.endless = endless
        self.now = 0.0
        self._kv_log: KvEventLog | None = None
        if kv_events:
            self._kv_log = self._new_kv_log()
        self.models = _served_models(scenario)
        self.sizings = [Sizing.of(m) for m in self.models]
        self._hashers = [PromptHasher(m.block_size) for m in self.models]
        # every model's requests, keyed by arrival at its engine core (after tokenization)
        self._arrivals: list[tuple[float, int, int, RequestSpec]] = []
        self._next = 0
        self._arrival_ids = itertools.count()
        # closed-loop models: the requests their clients will send, in order
        self._closed: dict[int, deque[RequestSpec]] = {
            mi: deque() for mi, m in enumerate(self.models) if m.workload.concurrency
        }
        self._closed_period = dict.fromkeys(self._closed, 0)
        self._period = 0  # the last period of the open-loop workload generated
        self._add_arrivals(0)
        for mi in self._closed:
            self._closed[mi].extend(self._specs(mi, 0))
        self._heap: list[tuple[float, int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._gen = 0
        self._rids = itertools.count()
        self._rr = [0] * len(self.models)
        self._inflight: set[int] = set()
        # An endless run keeps only the newest records: at 60x a day of traffic an hour.
        self.records: deque[dict[str, Any]] = deque(maxlen=ENDLESS_RECORDS if endless else None)
        # per model: requests, Σ TTFT (every request, also those dropped from `records`)
        self._ttft_n = [0] * len(self.models)
        self._ttft_sum = [0.0] * len(self.models)
        self.restarts: list[float] = []
        self._restart_count = 0
        self.aborted = 0
        # per model: the truth of the engines of the processes before the last restart, and
        # their never-reloaded chunks (summed as they die, so restarts cost no memory)
        self._archive_truth = [EngineTruth() for _ in self.models]
        self._archive_never = [0] * len(self.models)
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = mf.StoreCollector(lambda: self.metrics)
        self.registry.register(self._collector)
        self._start(0.0)
        self._schedule_first_events()

    def _schedule_first_events(self) -> None:
        """Each closed-loop client's first request, and the scenario's restart."""
        for mi, pending in self._closed.items():
            clients = self.models[mi].workload.concurrency or 0
            for c in range(min(clients, len(pending))):
                self._push(c * 1e-3, -1, self._send, (mi,))
        if self.scenario.restart_at_s is not None:
            self._push(self.scenario.restart_at_s, -1, self._restart, ())

    # -- clocks and workload periods -------------------------------------------------------

    @staticmethod
    def wall_clock(speed: float, now: float | None = None) -> dict[str, float]:
        """`epoch`/`time_scale` for a server running `speed` simulated seconds per real second.

        Its instants then land where they happen on the real clock, from now."""
        import time

        if speed <= 0:
            raise ValueError("speed must be positive")
        return {"epoch": time.time() if now is None else now, "time_scale": 1.0 / speed}

    def wall_time(self, t: float) -> float:
        """The wall time (epoch seconds) simulated instant t is reported at."""
        return self.epoch + t * self.time_scale

    def _new_kv_log(self) -> KvEventLog:
        from .kv_events import KvEventLog  # msgspec is needed only with events on

        # On the virtual calendar the log stamps batches itself (epoch + t, exactly as
        # always); on a mapped clock it keeps t and drain_kv_events maps it.
        return KvEventLog(0.0 if self.mapped_clock else self.epoch)

    def _specs(self, mi: int, period: int) -> list[RequestSpec]:
        m = self.models[mi]
        return generate(
            m.workload,
            m.duration_s,
            self.seed * 7919 + mi,
            m.max_model_len - max(1, m.workload.output_tokens),
            period=period,
            spill=self.endless,
        )

    def _add_arrivals(self, period: int) -> None:
        """Merge the open-loop requests of `period` into the arrivals still to come.

        A session's re-sends spill over the boundary, so periods interleave there."""
        new: list[tuple[float, int, int, RequestSpec]] = []
        for mi, m in enumerate(self.models):
            if mi in self._closed:
                continue
            fe_in = m.hardware.frontend_overhead_s / 2
            new += [(r.t + fe_in, mi, next(self._arrival_ids), r) for r in self._specs(mi, period)]
        # Consumed arrivals are dropped: an endless run holds one period or so at a time.
        self._arrivals = self._arrivals[self._next :] + new
        self._next = 0
        self._arrivals.sort(key=lambda a: (a[0], a[1], a[2]))

    def _extend(self, limit: float) -> None:
        """Endless runs: generate the next period(s) before time reaches their start."""
        d = self.scenario.duration_s
        while self.endless and d > 0:
            boundary = (self._period + 1) * d
            next_arr = (
                self._arrivals[self._next][0] if self._next < len(self._arrivals) else math.inf
            )
            if limit < boundary or next_arr < boundary:
                return
            self._period += 1
            self._add_arrivals(self._period)
            restart = self.scenario.restart_at_s
            if restart is not None:  # the scenario repeats, its restart included
                self._push(self._period * d + restart, -1, self._restart, ())

    # -- process lifecycle ---------------------------------------------------------------------

    def _start(self, t: float) -> None:
        primary = self.scenario
        self.metrics = mf.MetricStore(
            mf.families_for(
                primary.vllm_version,
                offloading=any(m.offloading for m in self.models),
                stores_skipped=any(m.offloading and m.store_threshold >= 2 for m in self.models),
                kv_cache_metrics=primary.kv_cache_metrics,
                max_model_len=max(m.max_model_len for m in self.models),
                tiering=any(m.offloading and m.secondary_tier for m in self.models),
            )
        )
        self.engines: list[list[Engine]] = []
        for mi, (m, sz) in enumerate(zip(self.models, self.sizings, strict=True)):
            self.engines.append([Engine(m, sz, e, self, self._rng(mi, e), t) for e in range(m.dp)])
        if self._kv_log is not None:
            for eng in self.engines[0]:
                eng.enable_kv_events(self._kv_log)

    def _rng(self, model_index: int, engine: int) -> random.Random:
        """Each engine's own stream (lookup jitter, block sampling), fixed by the seed."""
        return random.Random(hash((self.seed, model_index, engine, self._restart_count)))

    def _restart(self, t: float) -> None:
        """The process dies and comes back: caches empty, counters from zero, new _created."""
        for mi, engines in enumerate(self.engines):
            for eng in engines:
                cpu = eng.cpu
                _add(self._archive_truth[mi], eng.truth)
                if cpu is not None:
                    # chunks dropped by the restart were never reloaded either
                    self._archive_never[mi] += (
                        cpu.evicted_never_loaded + cpu.resident_never_loaded()
                    )
        self.aborted += len(self._inflight)
        self._inflight.clear()
        self._restart_count += 1
        self.restarts.append(t)
        if self.endless and len(self.restarts) > 1000:
            del self.restarts[:-1000]  # the newest are enough for /ground-truth
        self._gen += 1
        self._start(t)
        if self._kv_log is not None:
            self._kv_log.new_process(t, range(len(self.engines[0])))

    # -- event queue ---------------------------------------------------------------------------

    def _push(self, t: float, gen: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), gen, fn, args))

    def schedule(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Engines schedule their own follow-ups; a restart invalidates them (generation)."""
        self._push(t, self._gen, fn, args)

    def request_finished(self, record: dict[str, Any]) -> None:
        self._inflight.discard(record.pop("rid"))
        self.records.append(record)
        mi = next(
            (i for i, m in enumerate(self.models) if m.model_name == record["model_name"]), None
        )
        if mi is not None:
            self._ttft_n[mi] += 1
            self._ttft_sum[mi] += record["ttft_s"]
        if mi in self._closed:
            think = self.models[mi].workload.think_s
            self._push(record["t_finished"] + think, -1, self._send, (mi,))

    def _send(self, t: float, mi: int) -> None:
        """A closed-loop client sends its next request.

        It reaches the engine core after the API server's half of the frontend overhead."""
        pending = self._closed[mi]
        if not pending and self.endless:
            # the benchmark client starts its request list over, with new questions
            self._closed_period[mi] += 1
            pending.extend(self._specs(mi, self._closed_period[mi]))
        if not pending:
            return
        spec = replace(pending.popleft(), t=t)
        fe_in = self.models[mi].hardware.frontend_overhead_s / 2
        self._push(t + fe_in, -1, self._dispatch, (mi, spec))

    def _dispatch(self, t: float, mi: int, spec: RequestSpec) -> None:
        m = self.models[mi]
        engines = self.engines[mi]
        if m.routing == "hash":
            idx = ((spec.route_key * 2654435761) & 0xFFFFFFFF) % len(engines)
        else:
            idx = self._rr[mi] % len(engines)
            self._rr[mi] += 1
        hashes = self._hashers[mi].block_hashes(spec.segments)
        rid = next(self._rids)
        self._inflight.add(rid)
        req = Request(rid=rid, spec=spec, hashes=hashes, prompt=spec.prompt_tokens, t_engine=t)
        engines[idx].arrive(t, req)

    def _step_events(self, limit: float) -> bool:
        """Run the earliest event at or before `limit`; False when there is none."""
        if self.endless:
            self._extend(limit)
        next_arr = self._arrivals[self._next][0] if self._next < len(self._arrivals) else math.inf
        next_evt = self._heap[0][0] if self._heap else math.inf
        if min(next_arr, next_evt) > limit or (next_arr == next_evt == math.inf):
            return False
        if next_arr <= next_evt:
            t, mi, _, spec = self._arrivals[self._next]
            self._next += 1
            self.now = max(self.now, t)
            self._dispatch(t, mi, spec)
        else:
            t, _, gen, fn, args = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            if gen == -1 or gen == self._gen:
                fn(t, *args)
        return True

    # -- public API ----------------------------------------------------------------------------

    @property
    def kv_events(self) -> bool:
        return self._kv_log is not None

    @property
    def kv_event_log(self) -> KvEventLog | None:
        return self._kv_log

    def enable_kv_events(self) -> None:
        """Turn KV events on from now (a subscriber that joins late sees no earlier stores)."""
        if self._kv_log is not None:
            return
        self._kv_log = self._new_kv_log()
        for eng in self.engines[0]:
            eng.enable_kv_events(self._kv_log)

    def drain_kv_events(self) -> list[tuple[int, float, list[dict[str, Any]]]]:
        """KV event batches `(dp_rank, ts_epoch, events)` since the last drain, in time order.

        One batch is one engine step of the primary model; the list is empty with events off."""
        if self._kv_log is None:
            return []
        batches = self._kv_log.drain()
        if not self.mapped_clock:
            return batches
        return [(rank, self.wall_time(t), events) for rank, t, events in batches]

    def advance_to(self, t_virtual_seconds: float) -> None:
        """Run every event up to virtual time t (seconds since the simulation started)."""
        while self._step_events(t_virtual_seconds):
            pass
        self.now = max(self.now, t_virtual_seconds)

    def run(self) -> None:
        """Run the whole workload to completion (every request answered, every copy done)."""
        if self.endless:
            raise RuntimeError("an endless simulation never completes: use advance_to")
        while self._step_events(math.inf):
            pass
        self.now = max(self.now, self.scenario.duration_s)

    @property
    def finished(self) -> bool:
        if self.endless:
            return False
        if self._next < len(self._arrivals) or self.now < self.scenario.duration_s:
            return False
        if any(self._closed.values()):
            return False
        return not any(e[2] == self._gen or e[2] == -1 for e in self._heap)

    def render(self, timestamped: bool = False) -> bytes:
        """The /metrics body (text format 0.0.4), exactly as prometheus_client renders it.

        `timestamped=True` stamps samples with wall_time(now), unlike vLLM, for the sidecar's sake.
        A scraper honouring timestamps then sees simulated time; Prometheus drops such samples."""
        if not timestamped:
            return generate_latest(self.registry)
        self._collector.timestamp = self.wall_time(self.now)
        try:
            return generate_latest(self.registry)
        finally:
            self._collector.timestamp = None

    def ground_truth(self, include_requests: bool = True) -> dict[str, Any]:
        """What really happened: JSON-serialisable, cumulative over restarts."""
        per_model = [self._model_truth(mi) for mi in range(len(self.models))]
        primary = per_model[0]
        out: dict[str, Any] = {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "vllm_version": self.scenario.vllm_version,
            "now_s": self.now,
            "finished": self.finished,
            "endless": self.endless,
            "start_epoch": self.epoch,
            "restarts_s": list(self.restarts),
            "aborted_requests": self.aborted,
            "advice": self.scenario.advice,
            "models": per_model,
        }
        # the primary model's figures at top level, for the common single-model case
        for k in _PRIMARY_KEYS:
            out[k] = primary[k]
        out["requests_total"] = primary["requests"]
        if include_requests:
            # An endless run lists only the newest ENDLESS_RECORDS (`requests_listed`).
            out["ttft_s"] = [r["ttft_s"] for r in self.records]
            out["requests"] = list(self.records)
            out["requests_listed"] = len(self.records)
        return out

    def _model_truth(self, mi: int) -> dict[str, Any]:
        """Model `mi`'s truth summed over its engines and the processes before a restart."""
        m, sz = self.models[mi], self.sizings[mi]
        tot = EngineTruth()
        _add(tot, self._archive_truth[mi])
        evicted_never = self._archive_never[mi]
        resident_never = 0
        for eng in self.engines[mi]:
            _add(tot, eng.truth)
            if eng.cpu is not None:
                evicted_never += eng.cpu.evicted_never_loaded
                resident_never += eng.cpu.resident_never_loaded()
        n_ttft = self._ttft_n[mi]
        d = asdict(tot)
        d.update(
            {
                "model_name": m.model_name,
                "offloading": m.offloading,
                "cpu_gib": m.cpu_gib,
                "tp": m.tp,
                "dp": m.dp,
                "bytes_per_token": sz.bytes_per_token,
                "block_bytes": sz.block_bytes,
                "num_gpu_blocks_per_engine": sz.num_gpu_blocks,
                "gpu_kv_tokens_per_engine": sz.kv_cache_size_tokens,
                "cpu_num_chunks_per_engine": sz.cpu_num_chunks,
                "cpu_kv_cache_size_bytes_per_engine": sz.cpu_kv_cache_size_bytes,
                "prefill_tokens_per_s": sz.prefill_tokens_per_s,
                "true_offload_hit_ratio": (tot.loaded_tokens / tot.gpu_missed_tokens)
                if tot.gpu_missed_tokens
                else None,
                "gpu_hit_ratio": (tot.gpu_hit_tokens / (tot.gpu_hit_tokens + tot.gpu_missed_tokens))
                if tot.gpu_hit_tokens + tot.gpu_missed_tokens
                else None,
                "never_reloaded_evicted_bytes": evicted_never * sz.chunk_bytes,
                "never_reloaded_resident_bytes": resident_never * sz.chunk_bytes,
                "never_reloaded_bytes": (evicted_never + resident_never) * sz.chunk_bytes,
                "mean_ttft_s": self._ttft_sum[mi] / n_ttft if n_ttft else None,
            }
        )
        return d


def _add(into: EngineTruth, other: EngineTruth) -> None:
    for k, v in asdict(other).items():
        setattr(into, k, getattr(into, k) + v)


def _served_models(scenario: Scenario) -> list[Scenario]:
    """The scenario's models, each whole and validated; the first is the scenario itself."""
    models = [
        scenario,
        *(
            # What belongs to the process, not to a model, is the main scenario's.
            replace(
                m,
                extra_models=(),
                duration_s=scenario.duration_s,
                vllm_version=scenario.vllm_version,
                start_epoch=scenario.start_epoch,
                restart_at_s=scenario.restart_at_s,
                kv_cache_metrics=scenario.kv_cache_metrics,
                kv_cache_metrics_sample=scenario.kv_cache_metrics_sample,
            )
            for m in scenario.extra_models
        ),
    ]
    names = [m.model_name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"{scenario.name}: served model names must differ: {names}")
    for m in models:
        validate(m)
    return models
