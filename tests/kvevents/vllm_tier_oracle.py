"""An independent replay of vLLM 0.26.0's CPU tier for the what-if tests: vLLM's own
LRUCachePolicy / ARCCachePolicy / BlockStatus (loaded from its source; the only stand-in is
the module of type names they import, whose real one needs torch), driven by a plain
transcription of CPUOffloadingManager (cpu/manager.py) with its ref counts, over a lookup
stream rebuilt here from the decoded events with a plain parent dict. With `below`, the
TieringOffloadingManager's file-system tier (tiering/manager.py, fs/manager.py) sits under it:
every completed store is cascaded there, nothing is evicted there, and a block found only there
is promoted through `prepare_write` (the CPU manager's prepare_store of that one key)."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any, NewType

from kvoffload.kvevents.decode import CLEARED, REMOVED, STORED, decode_batch
from kvoffload.kvevents.eventfile import read_event_file

# vLLM 0.26.0's policy files, vendored (their README says from where).
VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.26-src" / "cpu-policies"


def available() -> bool:
    return VLLM.is_dir()


def _policies() -> dict[str, Any]:
    if "vllm.v1.kv_offload.cpu.policies.arc" not in sys.modules:
        for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu"):
            sys.modules.setdefault(name, types.ModuleType(name))
        base = types.ModuleType("vllm.v1.kv_offload.base")
        base.OffloadKey = NewType("OffloadKey", bytes)  # type: ignore[attr-defined]
        base.ReqContext = object  # type: ignore[attr-defined]
        sys.modules["vllm.v1.kv_offload.base"] = base
        pkg = types.ModuleType("vllm.v1.kv_offload.cpu.policies")
        pkg.__path__ = [str(VLLM)]
        sys.modules[pkg.__name__] = pkg
        for mod in ("base", "lru", "arc"):
            name = f"vllm.v1.kv_offload.cpu.policies.{mod}"
            spec = importlib.util.spec_from_file_location(name, VLLM / f"{mod}.py")
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    p = "vllm.v1.kv_offload.cpu.policies."
    return {
        "lru": sys.modules[p + "lru"].LRUCachePolicy,
        "arc": sys.modules[p + "arc"].ARCCachePolicy,
        "BlockStatus": sys.modules[p + "base"].BlockStatus,
    }


class Manager:
    """CPUOffloadingManager's lookup / prepare_load / complete_load / touch / prepare_store /
    complete_store, line for line (events and metrics left out), plus stored/loaded tallies."""

    def __init__(
        self, num_blocks: int, policy: str, store_threshold: int, tracker: int, below: bool = False
    ):
        classes = _policies()
        self.BlockStatus = classes["BlockStatus"]
        self.policy = classes[policy](cache_capacity=num_blocks)
        self.num_blocks = num_blocks
        self.allocated = 0
        self.free: list[int] = []
        self.evictable = 0
        self.store_threshold = store_threshold
        self.max_tracker_size = tracker
        self.counts: OrderedDict[int, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.loaded: dict[int, bool] = {}  # resident key → loaded since stored
        self.hits = self.stored = self.never_loaded = self.looked_up = 0
        self.below: set[int] | None = set() if below else None  # the fs tier's files
        self.promoted = 0

    def lookup(self, key: int) -> bool:
        if self.counts is not None:
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
            else:
                if len(self.counts) >= self.max_tracker_size:
                    self.counts.popitem(last=False)
                self.counts[key] = 1
        return self.policy.get(key) is not None

    def load(self, keys: list[int]) -> None:
        blocks = []
        for key in keys:  # prepare_load
            block = self.policy.get(key)
            if block.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.evictable -= 1
            block.ref_cnt += 1
            blocks.append(block)
            self.loaded[key] = True
        for key in keys:  # complete_load
            block = self.policy.get(key)
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.evictable += 1
                self.policy.mark_evictable(key)

    def store(self, keys: list[int], protect: set[int] | None = None) -> bool:
        if self.counts is not None:
            keys = [k for k in keys if self.counts.get(k, 0) >= self.store_threshold]
        to_store = [k for k in keys if self.policy.get(k) is None]
        if not to_store:
            return False
        free = len(self.free) + self.num_blocks - self.allocated
        need = len(to_store) - free
        if need > 0:
            if need > self.evictable:
                return False
            evicted = self.policy.evict(need, protect if protect is not None else set(keys))
            if evicted is None:
                return False
            self.evictable -= len(evicted)
            for key, block in evicted:
                self.free.append(block.block_id)
                if not self.loaded.pop(key):
                    self.never_loaded += 1
        for key in to_store:
            if self.allocated < self.num_blocks:
                block = self.BlockStatus(self.allocated)
                self.allocated += 1
            else:
                block = self.BlockStatus(self.free.pop())
            self.policy.insert(key, block)
            self.loaded[key] = False
        for key in to_store:  # complete_store(success=True)
            block = self.policy.get(key)
            block.ref_cnt = 0
            self.evictable += 1
            self.policy.mark_evictable(key)
        self.stored += len(to_store)
        if self.below is not None:  # complete_store: cascaded to every secondary tier
            self.below.update(to_store)
        return True

    def request(self, hashes: list[int], prefix: list[int]) -> None:
        """scheduler: _maximal_prefix_lookup, _touch, then the load and the store."""
        self.looked_up += len(hashes)
        hits = 0
        for key in hashes:
            if not self.lookup(key) and not self._promote(key, set(prefix + hashes)):
                break
            hits += 1
        self.policy.touch(prefix + hashes, None)
        self.load(hashes[:hits])
        self.hits += hits
        self.store(hashes)

    def _promote(self, key: int, protect: set[int]) -> bool:
        """TieringOffloadingManager.lookup on a CPU miss: the fs tier's hit, promoted.

        The request's own blocks are kept from eviction: vLLM re-looks-up a deferred request, so
        one it lost would come back from the fs tier.
        """
        if self.below is None or key not in self.below:
            return False
        counts, self.counts = self.counts, None  # prepare_write stores the key whatever its count
        written = self.store([key], protect)
        self.counts = counts
        if written:
            self.stored -= 1  # a promotion, not a store from the GPU (and not cascaded again)
            self.promoted += 1
            self.loaded[key] = False  # loaded by the request's load, as a CPU hit is
        return written

    def reset(self) -> None:
        self.never_loaded += sum(not v for v in self.loaded.values())
        self.loaded.clear()
        self.policy.clear()
        self.evictable = 0
        self.free.clear()
        self.allocated = 0
        if self.counts is not None:
            self.counts.clear()

    def result(self) -> tuple[int, int, int, int]:
        """(looked-up blocks, hits, stored blocks, stored and never loaded)."""
        resident = sum(not v for v in self.loaded.values())
        return self.looked_up, self.hits, self.stored, self.never_loaded + resident


def replay(
    path: str, num_blocks: int, policy: str, threshold: int, below: bool = False
) -> tuple[int, int, int, int]:
    """One engine's tier (rank 0; the captures have one) over a KV-event file."""
    return replay_manager(path, Manager(num_blocks, policy, threshold, 64_000, below)).result()


def replay_manager(path: str, mgr: Manager) -> Manager:
    """`mgr` driven by the lookups of a KV-event file."""
    parent: dict[int, int | None] = {}
    tails: set[int] = set()  # each GPU run's last block, until a run extends it
    for msg in read_event_file(path):
        for ev in decode_batch(msg.payload, msg.dp_rank).events:
            gpu = ev.medium in (None, "GPU", "gpu", "cuda")
            if ev.kind == STORED and gpu and ev.block_hashes:
                # offload_prompt_only: a lone block extending a run's tail was filled by
                # decoding, and the connector never looks it up nor stores it
                decoded = len(ev.block_hashes) == 1 and ev.parent_block_hash in tails
                tails.discard(ev.parent_block_hash)  # type: ignore[arg-type]
                tails.add(ev.block_hashes[-1])
                if decoded:
                    if ev.block_hashes[0] != ev.parent_block_hash:
                        parent[ev.block_hashes[0]] = ev.parent_block_hash
                    continue
                prefix: list[int] = []
                p = ev.parent_block_hash
                while p is not None and p in parent and p not in prefix:
                    prefix.append(p)
                    p = parent[p]
                prefix.reverse()
                mgr.request(list(ev.block_hashes), prefix)
                prev = ev.parent_block_hash
                for h in ev.block_hashes:
                    if h != prev:
                        parent[h] = prev
                    prev = h
            elif ev.kind == REMOVED and gpu:
                for h in ev.block_hashes:
                    parent.pop(h, None)
                    tails.discard(h)
            elif ev.kind == CLEARED:
                parent.clear()
                tails.clear()
                mgr.reset()
    return mgr
