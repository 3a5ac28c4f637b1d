"""The scenario library: named, documented situations with a known right answer.

Each is described in docs/scenarios.md: what it models, its right action and why, its figures."""

from __future__ import annotations

from dataclasses import replace

from .config import Scenario
from .model import (
    H200,
    H200_EAGER_SMALL,
    H200_GRAPHS,
    H200_SLOW_LINK,
    LAPTOP_ADA,
    QWEN3_0_6B,
    QWEN3_8B,
)
from .workload import Workload

GIB = 2**30
MIB = 2**20

# The seed article's batch: A cold, A again (GPU hit), B and C (evict A from the GPU), A resent.
LAPTOP_BATCH = (
    ("A-cold", "A", 1497),
    ("A-hit", "A", 1497),
    ("B", "B", 1593),
    ("C", "C", 1593),
    ("A-resent", "A", 1497),
)

_LAPTOP = Scenario(
    name="laptop-eviction",
    description=(
        "The seed article's measurement: Qwen3-0.6B shapes on an 8 GB laptop GPU with 256 MiB "
        "of GPU KV (146 blocks), a 0.5 GiB CPU tier (292 chunks), batches of A, A, B, C, A "
        "sent one after another; every batch uses fresh prompts."
    ),
    advice="keep",
    advice_why=(
        "The reloaded prefix A comes back 2.2x faster (35 ms vs 77 ms); a third of the "
        "GPU-missed tokens that can be served are served; the tier (4,672 tokens) is 2x the "
        "GPU KV (2,336) and each batch's prefixes survive until their reuse."
    ),
    duration_s=600.0,
    model=QWEN3_0_6B,
    served_model_name="Qwen/Qwen3-Reranker-0.6B",
    hardware=LAPTOP_ADA,
    scrape_interval_s=7.0,  # not a multiple of the 1.5 s batch: intervals differ, as in life
    max_model_len=2048,
    kv_cache_memory_bytes=256 * MIB,
    gpu_memory_utilization=0.92,
    cpu_gib=0.5,
    kv_cache_metrics=True,
    kv_cache_metrics_sample=0.1,
    workload=Workload(kind="batches", batch=LAPTOP_BATCH, request_interval_s=0.3),
)

_LAPTOP_OFF = replace(
    _LAPTOP,
    name="laptop-eviction-nooffload",
    description=(
        "The same laptop batches on a server without offloading: A resent is recomputed "
        "(~77 ms, like a cold request) because B and C evicted it from the GPU."
    ),
    advice="enable",
    advice_why=(
        "A fifth of the prompt tokens are prefixes seen seconds earlier but evicted from a "
        "GPU KV cache of 2,336 tokens (GPU usage high, prefix hit ratio far below the reuse in "
        "the traffic). A CPU tier of at least ~2x the GPU KV (0.5 GiB) catches them."
    ),
    cpu_gib=None,
)

# A RAG service on one H200 serving Qwen3-8B (147,456 KV bytes/token, 2.36 MB per block).
_RAG = Scenario(
    name="rag-hot-set-fits",
    description=(
        "RAG over 40 shared documents (1.5k-2.5k tokens, Zipf popularity), a 256-token system "
        "prompt and short questions, 1.5 requests/s for 30 minutes. GPU KV 2 GiB (~14.5k "
        "tokens, ~7 documents), CPU tier 16 GiB (~116k tokens): the whole hot set fits."
    ),
    advice="keep",
    advice_why=(
        "Most GPU-missed tokens are loaded from the CPU tier, a reload is several times faster "
        "than recomputing 8B prefixes, the tier is 8x the GPU KV and holds the whole working "
        "set (~12 GB) with headroom."
    ),
    duration_s=1800.0,
    model=QWEN3_8B,
    hardware=H200,
    max_model_len=4096,
    kv_cache_memory_bytes=2 * GIB,
    cpu_gib=16.0,
    workload=Workload(
        kind="documents",
        rate_rps=1.5,
        num_docs=40,
        doc_tokens=(1500, 2500),
        popularity="zipf",
        zipf_alpha=0.6,
        question_tokens=(20, 80),
        system_tokens=256,
    ),
)

_TOO_SMALL = replace(
    _RAG,
    name="buffer-too-small",
    description=(
        "The RAG traffic with a CPU tier the size of the GPU KV cache (2 GiB next to 2 GiB): "
        "the tier only mirrors what the GPU already holds and reuse is lost."
    ),
    advice="grow",
    advice_why=(
        "The offload hit ratio is near zero while GBs are stored; the CPU/GPU capacity ratio "
        "is ~1 (vLLM's own rule: the tier must exceed the GPU KV to add hits). The oracle "
        "sweep reaches 95% of the achievable hit ratio only at ~12 GiB."
    ),
    cpu_gib=2.0,
)

# The same too-small CPU tier with a file-system tier below it (TieringOffloadingSpec, `fs`):
# the chunks the CPU tier evicted are still found there and promoted back.
_TIERED = replace(
    _TOO_SMALL,
    name="tiered",
    description=(
        "The RAG traffic with the 2 GiB CPU tier of buffer-too-small and a 32 GiB file-system "
        'tier below it (TieringOffloadingSpec `fs`, tier="1:fs"; 6 GB/s read, an NVMe array; '
        "1.5 GB/s write): every chunk stored into the CPU tier is cascaded to it, and "
        "lookups the CPU tier misses are promoted back from it before the CPU-to-GPU load."
    ),
    advice="keep",
    advice_why=(
        "The offload path (CPU tier, then the fs tier below it) serves ~94% of the GPU-missed "
        "tokens: the fs tier finds ~99% of the chunks the CPU tier missed, and a token read "
        "from it at 6 GB/s and loaded to the GPU takes ~30 µs against ~100 µs to recompute "
        "it (analysis.tiering: the secondary tier pays). A larger CPU tier would save the "
        "promotion, not add hits."
    ),
    secondary_tier="fs",
    secondary_gib=32.0,
    secondary_read_gbps=6.0,
)

# Short documents reused often, each asked with a long one-off question: the questions fill a
# small tier and push the documents out (store_threshold's case: store only what comes back).
_ONE_OFF_QUESTIONS = replace(
    _RAG,
    name="one-off-questions",
    description=(
        "30 shared documents of 400-600 tokens, each asked about with a one-off 800-1,200 "
        "token question (pasted context), 3 requests/s for 20 minutes, uniform popularity. "
        "GPU KV 2 GiB, CPU tier 4 GiB (~29k tokens, ~20 requests' worth): the questions, "
        "never seen twice, take most of the stores and evict the documents."
    ),
    advice="store_threshold",
    advice_why=(
        "Replayed exactly over the KV events, store_threshold 2 stores ~2 GiB instead of "
        "~600 GiB over the run and doubles the offload hit ratio (0.08 to 0.16): the tier "
        "then holds the documents, which come back, rather than the questions, which do not. "
        "The tier's TTFT effect now is within its noise, so the cheaper tier is what to keep."
    ),
    advice_without_events="keep",
    duration_s=1200.0,
    cpu_gib=4.0,
    workload=Workload(
        kind="documents",
        rate_rps=3.0,
        num_docs=30,
        doc_tokens=(400, 600),
        popularity="uniform",
        question_tokens=(800, 1200),
    ),
)

# A hot set behind a stream of one-off documents (a scan): LRU lets the scan flush the hot set,
# ARC keeps what was seen twice.
_SCAN_HEAVY = replace(
    _RAG,
    name="scan-heavy",
    description=(
        "RAG over 20 shared documents (Zipf 0.3) where every other request brings a one-off "
        "document instead (a scan), 2 requests/s for 20 minutes. GPU KV 2 GiB, CPU tier 4 "
        "GiB: the one-off documents flush the shared ones out of an LRU tier."
    ),
    advice="grow",
    advice_why=(
        "The KV-event curve reaches 95% of its hit ratio at ~24 GiB and the bigger tier is "
        "predicted to save TTFT beyond its range; replayed exactly, ARC beats LRU at every "
        "size up to that (0.24 against 0.08 at 4 GiB, 0.435 against 0.413 at 24 GiB): "
        "eviction_policy arc."
    ),
    advice_without_events="keep",
    duration_s=1200.0,
    cpu_gib=4.0,
    workload=Workload(
        kind="documents",
        rate_rps=2.0,
        num_docs=20,
        doc_tokens=(1500, 2500),
        popularity="zipf",
        zipf_alpha=0.3,
        unique_fraction=0.5,
        question_tokens=(20, 80),
        system_tokens=256,
    ),
)

_OVERSIZED = Scenario(
    name="buffer-oversized",
    description=(
        "A small working set (10 documents of ~2k tokens, ~3 GB of KV) behind a 256 GiB CPU "
        "tier: 0.4 requests/s with short questions store ~1 MB/s, so filling the tier would "
        "take days."
    ),
    advice="shrink",
    advice_why=(
        "Every reusable prefix already hits; the tier's fill time (capacity / store rate) is "
        "more than a day, far beyond any observed reuse gap; 256 GiB of pinned host memory "
        "counts against the container limit for nothing. The oracle reaches the full hit "
        "ratio with a few GiB."
    ),
    duration_s=1800.0,
    model=QWEN3_8B,
    hardware=H200,
    max_model_len=4096,
    kv_cache_memory_bytes=1 * GIB,
    cpu_gib=256.0,
    workload=Workload(
        kind="documents",
        rate_rps=0.4,
        num_docs=10,
        doc_tokens=(1800, 2400),
        popularity="uniform",
        question_tokens=(8, 24),
        system_tokens=0,
    ),
)

_NO_REUSE = Scenario(
    name="no-reuse",
    description=(
        "Every request brings a new 2k-token document (summarisation of uploads) after a "
        "shared 256-token system prompt: 1 request/s, 16 GiB tier."
    ),
    advice="store_threshold",
    advice_why=(
        "~290 MB/s are stored and nothing is ever loaded back (reuse ratio 0 over windows "
        "longer than the tier's fill time of ~1 min): pure PCIe and pinned-memory cost. "
        "store_threshold: 2 stops storing one-off prefixes (or disable offloading)."
    ),
    duration_s=1200.0,
    model=QWEN3_8B,
    hardware=H200,
    max_model_len=4096,
    kv_cache_memory_bytes=2 * GIB,
    cpu_gib=16.0,
    workload=Workload(
        kind="documents",
        rate_rps=1.0,
        num_docs=1,
        unique_fraction=1.0,
        doc_tokens=(1500, 2500),
        question_tokens=(20, 80),
        system_tokens=256,
    ),
)

_GPU_PLENTY = Scenario(
    name="gpu-plenty",
    description=(
        "20 documents (~50k tokens of KV) on a GPU with 40 GiB of KV (~290k tokens), "
        "offloading on with an 8 GiB tier: nothing is ever evicted from the GPU."
    ),
    advice="disable",
    advice_why=(
        "All reuse is served by the GPU prefix cache (hit ratio ~ the traffic's reuse), no "
        "token is ever loaded from the CPU tier, yet every new block is copied to it. The CPU "
        "tier is smaller than the GPU KV, so it could not add hits anyway. (With offloading "
        "off the same traffic gets leave_off.)"
    ),
    duration_s=1200.0,
    model=QWEN3_8B,
    hardware=H200,
    max_model_len=4096,
    kv_cache_memory_bytes=40 * GIB,
    cpu_gib=8.0,
    workload=Workload(
        kind="documents",
        rate_rps=1.0,
        num_docs=20,
        doc_tokens=(1500, 3000),
        popularity="zipf",
        zipf_alpha=0.8,
        question_tokens=(20, 80),
        system_tokens=256,
    ),
)

_RECOMPUTE_WINS = Scenario(
    name="recompute-wins",
    description=(
        "Qwen3-0.6B shapes on an H200 (~290k prefill tokens/s) behind a slow host link "
        "(6 GB/s, ~52k tokens/s): 30 documents of ~3.5k tokens, 1 GiB of GPU KV, 8 GiB tier."
    ),
    advice="disable",
    advice_why=(
        "Loads are slower than recomputing (counter speedup well below 1.2x); every reload "
        "also waits one more engine step, so reloaded requests are slower than cold ones and "
        "offloading only costs PCIe traffic and pinned memory."
    ),
    duration_s=1200.0,
    model=QWEN3_0_6B,
    hardware=H200_SLOW_LINK,
    max_model_len=8192,
    kv_cache_memory_bytes=1 * GIB,
    cpu_gib=8.0,
    workload=Workload(
        kind="documents",
        rate_rps=2.0,
        num_docs=30,
        doc_tokens=(3000, 4000),
        popularity="zipf",
        zipf_alpha=0.6,
        question_tokens=(20, 80),
        system_tokens=0,
    ),
)

_PRESSURE = replace(
    _RAG,
    name="pressure-without-offloading",
    description=(
        "The RAG traffic (40 documents, Zipf) at 4 requests/s on a server without offloading "
        "and only 1 GiB of GPU KV (~7k tokens, three prompts): KV usage peaks near 1, bursts "
        "wait for capacity, and prefixes seen a minute ago are recomputed because the GPU "
        "evicted them within seconds (--kv-cache-metrics on: short lifetimes and idle times)."
    ),
    advice="enable",
    advice_why=(
        "The GPU prefix hit ratio (~0.2) is far below the reuse in the traffic (every document "
        "is asked about again and again), GPU blocks live only seconds before eviction, and "
        "requests wait for capacity. A CPU tier of ~12-16 GiB (many times the GPU KV) would "
        "serve most missed prefixes (the oracle's sweep with offloading on)."
    ),
    cpu_gib=None,
    kv_cache_memory_bytes=1 * GIB,
    kv_cache_metrics=True,
    kv_cache_metrics_sample=0.05,
    workload=replace(_RAG.workload, rate_rps=4.0),
)

_DP2 = replace(
    _RAG,
    name="dp2",
    description=(
        'The RAG service on two data-parallel engines (engine="0","1"), requests spread '
        "round-robin, each engine with 2 GiB of GPU KV and its own 16 GiB CPU tier; "
        "num_gpu_blocks on cache_config_info is the DP total, as in real vLLM."
    ),
    advice="keep",
    advice_why=(
        "Per engine the picture is the rag-hot-set-fits one: most GPU misses are served from "
        "the tier and the working set fits. Sizes are per engine; figures sum over engines."
    ),
    dp=2,
    workload=replace(_RAG.workload, rate_rps=3.0),
)

_RESTART = replace(
    _RAG,
    name="restart",
    description=(
        "The RAG service restarted after 15 of 30 minutes: every counter resets, lazily created "
        "series vanish until their first event, `_created` moves, caches start empty."
    ),
    advice="keep",
    advice_why=(
        "Same traffic as rag-hot-set-fits; the right answer must survive the counter reset "
        "(rates and increases skip the reset, nothing goes negative)."
    ),
    restart_at_s=900.0,
)

_LEGACY = replace(
    _RAG,
    name="legacy-0.23",
    description=(
        "The RAG service on vLLM 0.23: only the legacy kv_offload_total_bytes/_time/_size "
        "{transfer_type} families, created on the first transfer of each direction; no flat "
        "names, no kv_offload_config_info, no prompt_tokens_cached_by_source, the 0.23 "
        "cache_config_info label set (no kv_cache_size_tokens)."
    ),
    advice="keep",
    advice_why=(
        "Same as rag-hot-set-fits, read through the legacy names (CPU_to_GPU = load, "
        "GPU_to_CPU = store) and capacity from kv_offloading_size."
    ),
    vllm_version="0.23",
)

_TWO_MODELS = replace(
    _RAG,
    name="two-models",
    description=(
        "One process registry carrying two served models (model_name label): the RAG model "
        "with offloading, plus a Qwen3-0.6B chat model without it."
    ),
    advice="keep",
    advice_why=(
        "Judge each model_name on its own: the 8B RAG model keeps its tier; the 0.6B model has "
        "no offloading and its GPU KV holds its small working set (leave_off)."
    ),
    extra_models=(
        Scenario(
            name="two-models/chat",
            model=QWEN3_0_6B,
            hardware=H200,
            max_model_len=4096,
            kv_cache_memory_bytes=4 * GIB,
            cpu_gib=None,
            workload=Workload(
                kind="documents",
                rate_rps=2.0,
                num_docs=8,
                doc_tokens=(500, 1500),
                popularity="uniform",
                question_tokens=(20, 200),
                system_tokens=512,
            ),
        ),
    ),
)

# Agents re-sending their whole context after each tool call: a large universe of blocks
# (~330k distinct over the run), each reused a few times at short, random gaps.
_AGENTS = Scenario(
    name="agent-sessions",
    description=(
        "Agent sessions at scale: one new session a second, each a 2k-6k-token context "
        "re-sent 3 more times after tool calls (exponential gaps, mean 15 s), 4 requests/s "
        "on Qwen3-8B / H200 with 4 GiB of GPU KV and a 16 GiB CPU tier, 20 minutes: ~330k "
        "distinct blocks (~780 GB of KV computed once)."
    ),
    advice="grow",
    advice_why=(
        "The tier stores 1.6 GB/s (missed re-sends are stored again), so a 15 s reuse gap is "
        "~24 GB of KV in between, with an exponential tail: a 16 GiB tier serves 0.27 of the "
        "GPU-missed tokens where 0.70 is achievable; the oracle "
        "reaches 95% of it at 64 GiB. Only the KV-event curve can see this: the counters show "
        "a tier 4x the GPU KV, a good speedup and hits, so alone they say keep."
    ),
    advice_without_events="keep",
    duration_s=1200.0,
    model=QWEN3_8B,
    hardware=H200,
    max_model_len=8192,
    kv_cache_memory_bytes=4 * GIB,
    cpu_gib=16.0,
    workload=Workload(
        kind="sessions",
        rate_rps=4.0,
        doc_tokens=(2000, 6000),
        reuses=3,
        reuse_gap_s=15.0,
        question_tokens=(20, 200),
        system_tokens=0,
    ),
)

# The three sets of tests/fixtures/vllm-0.26-h200-ttft (real vLLM 0.26.0, one H200): 40 documents of
# 1,024 tokens, Zipf popularity, each request a document and a unique 32-token question, 400
# requests from a closed-loop client; the same requests with and without a CPU tier.
_REAL_WORKLOAD = Workload(
    kind="documents",
    num_docs=40,
    doc_tokens=(1024, 1024),
    question_tokens=(32, 32),
    popularity="zipf",
    zipf_alpha=1.0,
    requests=400,
)
_REAL_06B_PREFILL = Scenario(
    name="h200-0.6b-eager-prefill",
    description=(
        "Real set `live-0.6b-eager-prefill`: Qwen3-0.6B with --enforce-eager, 1 GiB of GPU "
        "KV, one output token, 4 concurrent clients, no CPU tier."
    ),
    advice="leave_off",
    advice_why=(
        "Recomputing a 1,024-token document costs this engine a few ms (its steps are launch "
        "overhead); a reload waits for the asynchronous load and the connector slows every "
        "step: on real vLLM a tier made mean TTFT ~24 ms worse while serving 42-72% of the "
        "GPU-missed tokens."
    ),
    duration_s=20.0,
    scrape_interval_s=1.0,
    model=QWEN3_0_6B,
    hardware=H200_EAGER_SMALL,
    max_model_len=2048,
    kv_cache_memory_bytes=1 * GIB,
    cpu_gib=None,
    workload=replace(_REAL_WORKLOAD, concurrency=4, output_tokens=1),
)
_REAL_06B_PREFILL_CPU2 = replace(
    _REAL_06B_PREFILL,
    name="h200-0.6b-eager-prefill-cpu2",
    cpu_gib=2.0,
    advice="disable",
    description="Real set `live-0.6b-eager-prefill` with a 2 GiB CPU tier.",
    advice_why="The tier hits (0.42 on real vLLM) but costs ~24 ms of mean TTFT.",
)
_REAL_06B_PREFILL_CPU4 = replace(
    _REAL_06B_PREFILL,
    name="h200-0.6b-eager-prefill-cpu4",
    cpu_gib=4.0,
    advice="disable",
    description="Real set `live-0.6b-eager-prefill` with a 4 GiB CPU tier.",
    advice_why=(
        "The tier hits well (0.72 on real vLLM) and still costs ~24 ms of mean TTFT: the case "
        "where hit ratio and payoff disagree."
    ),
)
_REAL_8B = Scenario(
    name="h200-8b-graphs",
    description=(
        "Real set `B`: Qwen3-8B with CUDA graphs, 2 GiB of GPU KV, 64 output tokens, 8 "
        "concurrent clients, no CPU tier."
    ),
    advice="enable",
    advice_why=(
        "Recomputing a document costs tens of ms on the 8B model; a reload's wait is one "
        "short step: on real vLLM a 5 GiB tier made mean TTFT ~38 ms better. Counters alone "
        "see a GPU prefix hit ratio of 0.59 and cannot tell that the misses come back: only "
        "the KV-event curve shows the reuse a tier would serve."
    ),
    advice_without_events="leave_off",
    duration_s=40.0,
    scrape_interval_s=1.0,
    model=QWEN3_8B,
    hardware=H200_GRAPHS,
    max_model_len=2048,
    kv_cache_memory_bytes=2 * GIB,
    cpu_gib=None,
    workload=replace(_REAL_WORKLOAD, concurrency=8, output_tokens=64),
)
_REAL_8B_CPU5 = replace(
    _REAL_8B,
    name="h200-8b-graphs-cpu5",
    cpu_gib=5.0,
    advice="keep",
    advice_without_events=None,
    description="Real set `B` with a 5 GiB CPU tier.",
    advice_why="The tier pays (~38 ms less mean TTFT on real vLLM).",
)
_REAL_8B_CPU10 = replace(
    _REAL_8B,
    name="h200-8b-graphs-cpu10",
    cpu_gib=10.0,
    advice="shrink",
    advice_without_events="keep",
    description="Real set `B` with a 10 GiB CPU tier.",
    advice_why=(
        "The tier pays (~38 ms less mean TTFT on real vLLM, as much as 5 GiB gave): the "
        "KV-event curve reaches 95% of its hit ratio at ~5.3 GiB, so half the pinned memory "
        "does; counters alone see a paying tier and keep it."
    ),
)
_REAL_06B_DECODE = replace(
    _REAL_8B,
    name="h200-0.6b-eager-decode",
    description=(
        "Real set `E`: Qwen3-0.6B with --enforce-eager, 1.5 GiB of GPU KV, 64 output tokens, "
        "8 concurrent clients, no CPU tier."
    ),
    advice="leave_off",
    advice_why="On real vLLM a 4 GiB tier made mean TTFT ~19 ms worse (0.64 of misses served).",
    advice_without_events=None,
    duration_s=90.0,
    model=QWEN3_0_6B,
    hardware=H200_EAGER_SMALL,
    kv_cache_memory_bytes=3 * GIB // 2,
)
_REAL_06B_DECODE_CPU4 = replace(
    _REAL_06B_DECODE,
    name="h200-0.6b-eager-decode-cpu4",
    cpu_gib=4.0,
    advice="disable",
    advice_without_events=None,
    description="Real set `E` with a 4 GiB CPU tier.",
    advice_why="The tier hits (0.64 on real vLLM) but costs ~19 ms of mean TTFT.",
)

_LIBRARY: dict[str, Scenario] = {
    s.name: s
    for s in (
        _LAPTOP,
        _LAPTOP_OFF,
        _RAG,
        _TOO_SMALL,
        _ONE_OFF_QUESTIONS,
        _SCAN_HEAVY,
        _OVERSIZED,
        _NO_REUSE,
        _GPU_PLENTY,
        _RECOMPUTE_WINS,
        _PRESSURE,
        _DP2,
        _TIERED,
        _RESTART,
        _LEGACY,
        _TWO_MODELS,
        _AGENTS,
        _REAL_06B_PREFILL,
        _REAL_06B_PREFILL_CPU2,
        _REAL_06B_PREFILL_CPU4,
        _REAL_8B,
        _REAL_8B_CPU5,
        _REAL_8B_CPU10,
        _REAL_06B_DECODE,
        _REAL_06B_DECODE_CPU4,
    )
}


def names() -> list[str]:
    """Names of the scenario library, in documentation order."""
    return list(_LIBRARY)


def get(name: str) -> Scenario:
    """A scenario by name; KeyError lists the known names."""
    try:
        return _LIBRARY[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(_LIBRARY)}") from None


__all__ = ["LAPTOP_BATCH", "Scenario", "get", "names"]
