"""Scenario: everything one simulated vLLM process is configured with, and the sizes it implies."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import H200, QWEN3_8B, Hardware, ModelShape, aligned_chunk_bytes
from .workload import Workload

ACTIONS = ("enable", "leave_off", "keep", "grow", "shrink", "store_threshold", "disable")


@dataclass(frozen=True)
class Scenario:
    """One vLLM server process (one model unless `extra_models`) and its traffic.

    Override anything with dataclasses.replace(); e.g. `replace(s, cpu_gib=None)` turns
    offloading off, `replace(s, vllm_version="0.23")` renders legacy names.
    """

    name: str
    description: str = ""
    advice: str = ""  # the action a correct advisor takes (one of ACTIONS)
    advice_why: str = ""
    # What an advisor reading only /metrics concludes, where KV events let it see further
    # (counters cannot measure reuse distances); None = the same as `advice`.
    advice_without_events: str | None = None
    duration_s: float = 1800.0  # natural length of the workload (virtual seconds)
    scrape_interval_s: float = 15.0  # how often tests and recordings scrape it
    vllm_version: str = "0.33"  # "0.33" or "0.23"
    start_epoch: float = 1_795_000_000.0  # virtual wall clock at t=0 (`_created`, timestamps)
    restart_at_s: float | None = None  # the server restarts at this virtual time
    kv_cache_metrics: bool = False  # --kv-cache-metrics (residency histograms)
    kv_cache_metrics_sample: float = 0.01  # --kv-cache-metrics-sample
    # model and hardware
    model: ModelShape = QWEN3_8B
    served_model_name: str | None = None  # `model_name` label; default model.name
    hardware: Hardware = H200
    tp: int = 1  # tensor-parallel ranks per engine
    dp: int = 1  # data-parallel engines
    routing: str = "round_robin"  # DP routing: "round_robin" or "hash" (by document)
    block_size: int = 16
    max_model_len: int = 4096
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes (per GPU)
    num_gpu_blocks: int | None = None  # alternative to kv_cache_memory_bytes (per engine)
    gpu_memory_utilization: float = 0.9  # label only
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    # native CPU offloading; cpu_gib None = offloading off
    cpu_gib: float | None = None  # --kv-offloading-size (GiB, total over the TP ranks)
    eviction_policy: str = "lru"  # "lru" | "arc"
    store_threshold: int = 0
    blocks_per_chunk: int = 1
    # A secondary tier below the CPU tier (TieringOffloadingSpec): its type ("fs", "obj"; the
    # `tier` label is "1:<type>"), size and read/write bandwidth; None = the CPU spec alone.
    secondary_tier: str | None = None
    secondary_gib: float = 0.0
    secondary_read_gbps: float = 2.0
    secondary_write_gbps: float = 1.5
    # traffic
    workload: Workload = field(default_factory=Workload)
    # Other models served by the same process (same registry, own `model_name`). Their
    # process-level fields (duration, version, restart, epoch, kv_cache_metrics) are ignored.
    extra_models: tuple[Scenario, ...] = ()

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    @property
    def offloading(self) -> bool:
        return self.cpu_gib is not None


@dataclass(frozen=True)
class Sizing:
    """Sizes implied by a scenario (per engine unless stated)."""

    bytes_per_token: int  # KV bytes per token, all TP ranks
    block_bytes: int  # one GPU block, all TP ranks (what a transfer of one block moves)
    num_gpu_blocks: int  # incl. the null block
    kv_cache_size_tokens: int
    chunk_bytes: int  # bytes moved per CPU chunk (all ranks)
    aligned_chunk_bytes: int  # slot size in the CPU tier (page aligned)
    cpu_num_chunks: int
    cpu_kv_cache_size_bytes: int
    prefill_tokens_per_s: float

    @classmethod
    def of(cls, s: Scenario) -> Sizing:
        bpt = s.model.kv_bytes_per_token
        block_bytes = bpt * s.block_size
        rank_block = block_bytes // s.tp
        if s.num_gpu_blocks is not None:
            num_gpu_blocks = s.num_gpu_blocks
        elif s.kv_cache_memory_bytes is not None:
            num_gpu_blocks = s.kv_cache_memory_bytes // rank_block
        else:
            raise ValueError(f"{s.name}: set kv_cache_memory_bytes or num_gpu_blocks")
        chunk = block_bytes * s.blocks_per_chunk
        aligned = aligned_chunk_bytes(block_bytes, s.blocks_per_chunk)
        chunks = int(s.cpu_gib * 2**30) // aligned if s.cpu_gib is not None else 0
        return cls(
            bytes_per_token=bpt,
            block_bytes=block_bytes,
            num_gpu_blocks=num_gpu_blocks,
            kv_cache_size_tokens=num_gpu_blocks * s.block_size,
            chunk_bytes=chunk,
            aligned_chunk_bytes=aligned,
            cpu_num_chunks=chunks,
            cpu_kv_cache_size_bytes=chunks * aligned,
            prefill_tokens_per_s=s.hardware.prefill_tokens_per_s(s.model, s.tp),
        )


def validate(s: Scenario) -> None:
    sz = Sizing.of(s)
    usable_tokens = (sz.num_gpu_blocks - 1) * s.block_size
    if usable_tokens < s.max_model_len:
        raise ValueError(
            f"{s.name}: GPU KV holds {usable_tokens} tokens, less than max_model_len "
            f"{s.max_model_len} (vLLM refuses to start)"
        )
    if s.vllm_version not in ("0.33", "0.23"):
        raise ValueError(f"{s.name}: vllm_version must be '0.33' or '0.23'")
    if s.routing not in ("round_robin", "hash"):
        raise ValueError(f"{s.name}: routing must be 'round_robin' or 'hash'")
    if s.tp < 1 or s.dp < 1 or s.blocks_per_chunk < 1:
        raise ValueError(f"{s.name}: tp, dp and blocks_per_chunk must be >= 1")
