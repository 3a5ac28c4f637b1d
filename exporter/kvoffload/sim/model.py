"""Model shapes and hardware profiles: the physics the simulator runs on.

All timing derives from a few numbers, so KV sizes, prefill speed and transfers stay consistent.
The laptop profile is calibrated to the seed article (tests/sim/test_sim_calibration.py)."""

from __future__ import annotations

from dataclasses import dataclass

PAGE_SIZE = 4096  # vLLM aligns each CPU chunk to the OS page size (mmap.PAGESIZE)


@dataclass(frozen=True)
class ModelShape:
    """The parts of a transformer that decide KV bytes and prefill FLOPs."""

    name: str  # the served model name (the `model_name` label)
    num_layers: int
    num_kv_heads: int
    head_dim: int
    params: float  # parameter count; prefill FLOPs ≈ 2 × params × tokens
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head (the whole model, summed over TP ranks)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Hardware:
    """One GPU and its host link, plus the fixed costs of the vLLM engine around it."""

    name: str
    tflops: float  # nominal dense bf16 TFLOPS of one GPU
    efficiency: float  # achieved fraction of `tflops` during prefill (calibrated)
    load_gbps: float  # CPU→GPU copy bandwidth of one rank, GB/s (1e9 B/s)
    store_gbps: float  # GPU→CPU copy bandwidth of one rank, GB/s
    transfer_latency_s: float  # fixed cost of one copy job on one rank
    prefill_overhead_s: float  # fixed cost of one engine step that runs a prefill
    frontend_overhead_s: float  # tokenize + detokenize in the API server: TTFT only
    engine_step_s: float  # an (idle) engine step: how late finished transfers are noticed
    # What only some engines pay (real vLLM 0.26.0 on an H200, docs/advisor.md):
    decode_s_per_seq: float = 0.0  # each decoding sequence in a step
    # The offloading connector's own work per step (scheduler and worker side), and the
    # copy-out of newly computed blocks where it sits on the step's critical path (an engine
    # bound by per-step overhead: eager mode, small models); None = hidden behind compute.
    offload_step_overhead_s: float = 0.0  # every step
    offload_prefill_overhead_s: float = 0.0  # steps that schedule new prefills
    store_critical_gbps: float | None = None

    def prefill_tokens_per_s(self, shape: ModelShape, tp: int = 1) -> float:
        """Prefill throughput of one engine; TP ranks split the FLOPs (ideal scaling)."""
        flops_per_token = 2.0 * shape.params
        return self.tflops * 1e12 * self.efficiency * tp / flops_per_token


# --- model shapes ------------------------------------------------------------------------------

QWEN3_0_6B = ModelShape(
    name="Qwen/Qwen3-0.6B", num_layers=28, num_kv_heads=8, head_dim=128, params=0.6e9
)
QWEN3_8B = ModelShape(
    name="Qwen/Qwen3-8B", num_layers=36, num_kv_heads=8, head_dim=128, params=8.2e9
)
LLAMA_3_1_70B = ModelShape(
    name="meta-llama/Llama-3.1-70B-Instruct",
    num_layers=80,
    num_kv_heads=8,
    head_dim=128,
    params=70.6e9,
)


# --- hardware ------------------------------------------------------------------------------------

# The seed article's 8 GB Ada laptop GPU. Calibration (Qwen3-0.6B, 1,497-token prompt):
#   recompute 1,488 tokens in ~63 ms → ~23,600 tokens/s → tflops × efficiency = 28.3 TFLOP/s;
#   GPU-hit TTFT ~14 ms = frontend 6 ms + prefill step overhead 7.8 ms + 9 tokens;
#   a reload adds 13.5 ms of copy (170,655,744 B at 12.6 GB/s) + one engine step (7.4 ms) → ~35 ms.
LAPTOP_ADA = Hardware(
    name="laptop-ada-8gb",
    tflops=60.0,
    efficiency=0.4724,
    load_gbps=12.65,
    store_gbps=11.9,
    transfer_latency_s=20e-6,
    prefill_overhead_s=0.0078,
    frontend_overhead_s=0.006,
    engine_step_s=0.0074,
)

# One H200 (PCIe Gen5 host link). Transfer speeds as measured on a real vLLM 0.26.0 server
# (loads ~32.5 GB/s, stores ~32.9 GB/s); a reload waited ~10 ms (one engine step) in queue time.
H200 = Hardware(
    name="h200",
    tflops=989.0,
    efficiency=0.5,
    load_gbps=32.5,
    store_gbps=32.9,
    transfer_latency_s=30e-6,
    prefill_overhead_s=0.006,
    frontend_overhead_s=0.006,
    engine_step_s=0.010,
)

# The same GPU behind a slow host link (e.g. a Gen4 x4 riser or a shared PCIe switch):
# the recompute-wins case, where copying KV back is slower than recomputing it.
H200_SLOW_LINK = Hardware(
    name="h200-slow-link",
    tflops=989.0,
    efficiency=0.5,
    load_gbps=6.0,
    store_gbps=6.0,
    transfer_latency_s=50e-6,
    prefill_overhead_s=0.004,
    frontend_overhead_s=0.004,
    engine_step_s=0.010,
)

# The H200 engines of the real vLLM 0.26.0 sets (tests/fixtures/vllm-0.26-h200-ttft),
# calibrated so that the simulator's versions of its three sets give their TTFT changes
# (tests/sim/test_sim_ttft.py).
# Qwen3-0.6B with --enforce-eager: every step costs ~18 ms of launch overhead whatever it
# computes, and the offloading connector adds ~2.3 ms to every step (the inter-token latency
# rose 19.7 → 22.0 ms) and ~8 ms to a step that schedules new prefills (lookups, store
# preparation): the prefill got 5–12 ms slower with a tier while recomputing less.
H200_EAGER_SMALL = Hardware(
    name="h200-eager-small",
    tflops=989.0,
    efficiency=0.3,
    load_gbps=32.5,
    store_gbps=32.9,
    transfer_latency_s=30e-6,
    prefill_overhead_s=0.018,
    frontend_overhead_s=0.030,
    engine_step_s=0.002,
    decode_s_per_seq=0.0002,
    offload_step_overhead_s=0.0023,
    offload_prefill_overhead_s=0.008,
)
# Qwen3-8B with CUDA graphs: ~5.5 ms per step, recompute dominates a 1,024-token prefill.
H200_GRAPHS = Hardware(
    name="h200-graphs",
    tflops=989.0,
    efficiency=0.7,
    load_gbps=32.5,
    store_gbps=32.9,
    transfer_latency_s=30e-6,
    prefill_overhead_s=0.0055,
    frontend_overhead_s=0.015,
    engine_step_s=0.002,
    decode_s_per_seq=0.00003,
    offload_step_overhead_s=0.0004,
    offload_prefill_overhead_s=0.004,
)


def aligned_chunk_bytes(block_bytes: int, blocks_per_chunk: int) -> int:
    """Bytes one CPU chunk slot takes: vLLM rounds each chunk up to the page size."""
    raw = block_bytes * blocks_per_chunk
    return -(-raw // PAGE_SIZE) * PAGE_SIZE
