"""The `promtool test rules` cases for every alert, written out as alerts/tests/*.yaml.

Each case is a small workload in real vLLM series names and labels (exact sample names,
`model_name`/`engine` labels, `transfer_type` mirrors, `cache_config_info` labels), rendered in
the variants the rules must survive: flat and deprecated offload names, the `vllm:` and the
escaped `vllm_` spelling, a counter reset, two engines. Expected annotations are rendered from
the alert templates of rules.py, so a change of wording is caught as well.

Run `python tests/rules/promtool_cases.py` to rewrite the committed file; test_promtool.py
fails when it is stale.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.rules import ALERTS_FILE, RULES_FILE, alerting_rules, to_yaml

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = ROOT / "alerts" / "tests" / "kvoffload-alerts.test.yaml"

INSTANCE = "vllm-0:8000"
SIDECAR = "vllm-0:19400"
MODEL = "qwen3-8b"
MINUTES = 180  # 3 h of samples at 1 m: long enough for the 1 h windows and 1 h `for:`
EVAL = "150m"
KV_BYTES_PER_TOKEN = 147_456  # Qwen3-8B bf16, as on the real H200 run


# -- workloads ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """How a server exposes the same workload."""

    spelling: str = ":"  # ":" as vLLM serves it, "_" as Prometheus 2 stores OpenMetrics
    offload: str | None = "both"  # None (off), "flat", "legacy" (≤0.23), "both" (0.24–0.33)
    reset: bool = False  # every counter restarts from zero at minute 120
    engines: tuple[str, ...] = ("0",)


def _values(per_min: float, reset: bool, start: float = 0.0) -> str:
    if not reset:
        return f"{_n(start)}+{_n(per_min)}x{MINUTES}"
    # A restarted counter has already counted one interval when first scraped again.
    return f"{_n(start)}+{_n(per_min)}x120 {_n(per_min)}+{_n(per_min)}x{MINUTES - 121}"


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


@dataclass
class Series:
    items: list[dict[str, str]] = field(default_factory=list)

    def add(self, name: str, values: str, **labels: str) -> Series:
        self.items.append({"series": name + _labels(**labels), "values": values})
        return self


def _engine(v: Variant, engine: str, **extra: str) -> dict[str, str]:
    return {"job": "vllm", "instance": INSTANCE, "model_name": MODEL, "engine": engine, **extra}


def vllm_counter(s: Series, v: Variant, name: str, per_min: float, **extra: str) -> None:
    for e in v.engines:
        s.add(f"vllm{v.spelling}{name}", _values(per_min, v.reset), **_engine(v, e, **extra))


def vllm_gauge(s: Series, v: Variant, name: str, value: float, **extra: str) -> None:
    for e in v.engines:
        s.add(f"vllm{v.spelling}{name}", f"{_n(value)}+0x{MINUTES}", **_engine(v, e, **extra))


def transfers(
    s: Series, v: Variant, direction: str, bytes_per_min: float, seconds_per_min: float
) -> None:
    """Load or store counters the way each vLLM generation exposes them."""
    if v.offload is None:
        return
    moving = bytes_per_min > 0
    flat = v.offload in ("flat", "both") and moving  # flat children appear on first transfer
    legacy = v.offload == "both" or (v.offload == "legacy" and moving)  # eager since 0.24
    transfer_type = "CPU_to_GPU" if direction == "load" else "GPU_to_CPU"
    if flat:
        vllm_counter(s, v, f"kv_offload_{direction}_bytes_total", bytes_per_min)
        vllm_counter(s, v, f"kv_offload_{direction}_time_total", seconds_per_min)
    if legacy:
        vllm_counter(
            s, v, "kv_offload_total_bytes_total", bytes_per_min, transfer_type=transfer_type
        )
        vllm_counter(
            s, v, "kv_offload_total_time_total", seconds_per_min, transfer_type=transfer_type
        )


def cache_config(s: Series, v: Variant, offloading_size: str) -> None:
    for e in v.engines:  # no model_name on this metric
        s.add(
            f"vllm{v.spelling}cache_config_info",
            f"1+0x{MINUTES}",
            job="vllm",
            instance=INSTANCE,
            engine=e,
            block_size="16",
            enable_prefix_caching="True",
            kv_cache_size_tokens="2336",
            kv_offloading_backend="native",
            kv_offloading_size=offloading_size,
            num_gpu_blocks="146",
        )


def serving(
    s: Series,
    v: Variant,
    tokens_per_min: float,
    gpu_hit: float,
    external: float = 0.0,
    compute_seconds_per_min: float = 0.0,
) -> None:
    """Prompt traffic per minute: GPU prefix lookups and hits, connector lookups and hits
    (`external` tokens), token sources, prefill time."""
    hits = tokens_per_min * gpu_hit
    missed = tokens_per_min - hits
    vllm_counter(s, v, "prompt_tokens_total", tokens_per_min)
    vllm_counter(s, v, "prefix_cache_queries_total", tokens_per_min)
    vllm_counter(s, v, "prefix_cache_hits_total", hits)
    vllm_counter(s, v, "external_prefix_cache_queries_total", missed)
    vllm_counter(s, v, "external_prefix_cache_hits_total", external)
    for source, value in (
        ("local_compute", missed - external),
        ("local_cache_hit", hits),
        ("external_kv_transfer", external),
    ):
        vllm_counter(s, v, "prompt_tokens_by_source_total", value, source=source)
    vllm_counter(s, v, "request_prefill_time_seconds_sum", compute_seconds_per_min)
    vllm_counter(s, v, "num_preemptions_total", 0)


def sidecar_gauge(s: Series, name: str, value: float, **labels: str) -> None:
    s.add(
        name,
        f"{_n(value)}+0x{MINUTES}",
        job="kvoffload",
        instance=SIDECAR,
        target=INSTANCE,
        model_name=MODEL,
        **labels,
    )


def up(s: Series, value: int = 1) -> None:
    s.add("up", f"{value}+0x{MINUTES}", job="vllm", instance=INSTANCE)


# -- expected alerts ---------------------------------------------------------------------------
VLLM_LABELS = {"job": "vllm", "instance": INSTANCE, "model_name": MODEL}


@dataclass(frozen=True)
class Case:
    name: str
    alert: str
    series: list[dict[str, str]]
    fires: list[tuple[dict[str, str], str]]  # (labels, how $value renders); [] = stays quiet
    eval_time: str = EVAL
    exprs: list[tuple[str, list[tuple[dict[str, str], float]]]] = field(default_factory=list)


_IF = re.compile(
    r'\{\{ (?:else )?if eq \$labels\.(\w+) "([^"]*)" \}\}|\{\{ else \}\}|\{\{ end \}\}'
)


_WITH_QUERY = re.compile(
    r'\{\{ with printf "((?:[^"\\]|\\.)*)" \$labels\.(\w+) \$labels\.(\w+) \| query \}\}'
    r"(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}",
    re.S,
)
# What the alert texts read of a queried sample (`.` is the query's result).
_DOT = re.compile(
    r'\{\{ \. \| first \| (?:value \| (humanize1024|printf "%\+\.3f")|label "(\w+)") \}\}'
)


def humanize1024(v: float) -> str:
    """Prometheus' template function of that name."""
    if abs(v) <= 1:
        return f"{v:.4g}"
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return f"{v:.4g}{prefix}"


def _queried(series: list[dict[str, str]], selector: str) -> tuple[float, dict[str, str]] | None:
    """The value at every step of the one input series `selector` names exactly (the cases
    give the sidecar's series as constants) and its labels, None when none does."""
    name, _, rest = selector.partition("{")
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    for item in series:
        s_name, _, s_rest = item["series"].partition("{")
        have = dict(re.findall(r'(\w+)="([^"]*)"', s_rest))
        if s_name == name and wanted.items() <= have.items():
            return float(item["values"].split("+")[0]), have
    return None


def render(
    template: str, labels: dict[str, str], value: str, series: list[dict[str, str]] = ()
) -> str:
    """The subset of Go templating the alert texts use: labels, $value, if/else-if/else, and
    `with printf … | query` of one of the case's input series."""

    def with_query(m: re.Match[str]) -> str:
        selector = m.group(1).replace('\\"', '"') % (labels.get(m.group(2), ""),
                                                      labels.get(m.group(3), ""))  # fmt: skip
        found = _queried(list(series), selector)
        if found is None:
            return m.group(5)
        v, have = found

        def dot(d: re.Match[str]) -> str:
            if d.group(2):
                return have.get(d.group(2), "")
            return humanize1024(v) if d.group(1) == "humanize1024" else f"{v:+.3f}"

        return _DOT.sub(dot, m.group(4))

    template = _WITH_QUERY.sub(with_query, template)
    out, pos, taking, taken = [], 0, [True], [False]
    for m in _IF.finditer(template):
        if taking[-1]:
            out.append(template[pos : m.start()])
        token = m.group(0)
        if token.startswith("{{ if"):
            ok = labels.get(m.group(1)) == m.group(2)
            taking.append(ok)
            taken.append(ok)
        elif token.startswith("{{ else if"):
            ok = not taken[-1] and labels.get(m.group(1)) == m.group(2)
            taking[-1] = ok
            taken[-1] = taken[-1] or ok
        elif token == "{{ else }}":
            taking[-1] = not taken[-1]
        else:
            taking.pop()
            taken.pop()
        pos = m.end()
    out.append(template[pos:])
    text = "".join(out)
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    return re.sub(r'\{\{ (?:\$value \| \w+|printf "[^"]*" \$value) \}\}', value, text)


def _alert_rules(cfg: MixinConfig) -> dict[str, dict[str, object]]:
    return {str(r["alert"]): r for r in alerting_rules(cfg)}


def to_test(case: Case, rules: dict[str, dict[str, object]]) -> dict[str, object]:
    rule = rules[case.alert]
    annotations = rule["annotations"]
    assert isinstance(annotations, dict)
    exp = []
    for labels, value in case.fires:
        full = {**labels, **rule["labels"]}  # type: ignore[dict-item]
        exp.append(
            {
                "exp_labels": full,
                "exp_annotations": {
                    "summary": annotations["summary"],
                    "description": render(annotations["description"], full, value, case.series),
                    "runbook_url": annotations["runbook_url"],
                },
            }
        )
    test: dict[str, object] = {
        "name": case.name,
        "interval": "1m",
        "input_series": case.series,
        "alert_rule_test": [
            {"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": exp}
        ],
    }
    if case.exprs:
        test["promql_expr_test"] = [
            {
                "expr": expr,
                "eval_time": case.eval_time,
                "exp_samples": [
                    {"labels": _sample_labels(lb), "value": val} for lb, val in samples
                ],
            }
            for expr, samples in case.exprs
        ]
    return test


def _sample_labels(labels: dict[str, str]) -> str:
    name = labels.get("__name__", "")
    rest = {k: v for k, v in labels.items() if k != "__name__"}
    return name + _labels(**rest)


# -- the cases ---------------------------------------------------------------------------------
BASE = Variant()
ESCAPED = Variant(spelling="_")
LEGACY = Variant(offload="legacy")
RESET = Variant(reset=True)
TWO_ENGINES = Variant(engines=("0", "1"))
OFF = Variant(offload=None)


# The TTFT change the cases' sidecar predicts for its advice (seconds; negative = faster).
PREDICTED_TTFT_CHANGE = -0.042


def with_advised_size(items: list[dict[str, str]], size: float) -> list[dict[str, str]]:
    """The workload with the sidecar next to the engine advising `size` bytes and predicting
    a TTFT change: the alert's text then names both (its template queries
    kvoffload_recommended_size_bytes and kvoffload_recommended_ttft_change_seconds)."""
    s = Series(list(items))
    sidecar_gauge(s, "kvoffload_recommended_size_bytes", size)
    for bound, value in (("estimate", 0.0), ("low", -0.02), ("high", 0.02)):
        sidecar_gauge(
            s,
            "kvoffload_recommended_ttft_change_seconds",
            PREDICTED_TTFT_CHANGE + value,
            basis="predicted",
            bound=bound,
        )
    return s.items


def recommend_enable() -> list[Case]:
    alert = "KVOffloadRecommendEnable"

    def workload(
        v: Variant,
        gpu_hit: float = 0.2,
        usage: float = 0.95,
        preempt: float = 2,
        tokens: float = 120_000,
        size: str = "None",
    ) -> list[dict[str, str]]:
        s = Series()
        serving(s, v, tokens, gpu_hit)
        s.items = [i for i in s.items if "num_preemptions" not in i["series"]]
        vllm_counter(s, v, "num_preemptions_total", preempt)
        vllm_gauge(s, v, "kv_cache_usage_perc", usage)
        vllm_gauge(s, v, "num_requests_waiting_by_reason", 0, reason="capacity")
        vllm_gauge(s, v, "num_requests_waiting_by_reason", 0, reason="deferred")
        cache_config(s, v, size)
        transfers(s, v, "store", 0, 0)
        transfers(s, v, "load", 0, 0)
        return s.items

    fire = [(VLLM_LABELS, "20%")]
    return [
        Case(
            "RecommendEnable: fires under KV pressure with prefixes lost",
            alert,
            workload(OFF),
            fire,
        ),
        Case(
            "RecommendEnable: names the size the sidecar advises",
            alert,
            with_advised_size(workload(OFF), 12 * 2**30),
            fire,
        ),
        Case(
            "RecommendEnable: escaped vllm_ names",
            alert,
            workload(replace(OFF, spelling="_")),
            fire,
        ),
        Case(
            "RecommendEnable: ratio of sums over two engines",
            alert,
            workload(replace(OFF, engines=("0", "1"))),
            fire,
        ),
        Case(
            "RecommendEnable: survives a counter reset",
            alert,
            workload(replace(OFF, reset=True)),
            fire,
        ),
        Case(
            "RecommendEnable: waiting for capacity alone is pressure",
            alert,
            _waiting_only(workload(OFF, usage=0.3, preempt=0)),
            fire,
        ),
        # The advisor's churn term (conditions.GPU_PRESSURE): prefixes evicted from the GPU
        # within the reuse horizon are pressure, read from the sidecar's GPU capacity: 96k
        # tokens/min written into 100k tokens turn over in 62.5 s (< 600 s).
        Case(
            "RecommendEnable: GPU turnover under the reuse horizon alone is pressure",
            alert,
            _with_gpu_capacity(workload(OFF, usage=0.3, preempt=0), 100_000),
            fire,
        ),
        Case(
            "RecommendEnable: quiet when prefixes outlive the reuse horizon on the GPU",
            alert,
            _with_gpu_capacity(workload(OFF, usage=0.3, preempt=0), 10_000_000),
            [],
        ),
        Case(
            "RecommendEnable: quiet when the GPU prefix cache already hits",
            alert,
            workload(OFF, gpu_hit=0.8),
            [],
        ),
        Case(
            "RecommendEnable: quiet without KV pressure",
            alert,
            workload(OFF, usage=0.3, preempt=0),
            [],
        ),
        Case(
            "RecommendEnable: quiet without any prefix reuse", alert, workload(OFF, gpu_hit=0.0), []
        ),
        Case("RecommendEnable: quiet under a light load", alert, workload(OFF, tokens=30_000), []),
        Case(
            "RecommendEnable: quiet when offloading is on (deprecated names)",
            alert,
            workload(Variant(offload="both"), size="0.65"),
            [],
        ),
        Case(
            "RecommendEnable: quiet when offloading is configured, series not yet created",
            alert,
            workload(LEGACY, size="0.65"),
            [],
        ),
        Case(
            "RecommendEnable: quiet when idle",
            alert,
            workload(OFF, tokens=0, usage=0.0, preempt=0),
            [],
        ),
    ]


def _stored_before(items: list[dict[str, str]], stored: float) -> list[dict[str, str]]:
    """The store counters start at `stored`: history from before the test's window."""
    out = []
    for item in items:
        if "store_bytes_total" in item["series"] or (
            'transfer_type="GPU_to_CPU"' in item["series"] and "bytes" in item["series"]
        ):
            item = {**item, "values": _n(stored) + item["values"][item["values"].index("+") :]}
        out.append(item)
    return out


def _with_gpu_capacity(items: list[dict[str, str]], tokens: float) -> list[dict[str, str]]:
    s = Series()
    sidecar_gauge(s, "kvoffload_gpu_capacity_tokens", tokens)
    return items + s.items


def _waiting_only(items: list[dict[str, str]]) -> list[dict[str, str]]:
    return [
        {**i, "values": f"3+0x{MINUTES}"} if 'reason="capacity"' in i["series"] else i
        for i in items
    ]


def low_prefix_reuse() -> list[Case]:
    alert = "KVOffloadLowPrefixReuse"

    def workload(
        v: Variant, store: float = 600e6, load: float = 0.0, capacity: float | None = None
    ) -> list[dict[str, str]]:
        s = Series()
        serving(s, v, 120_000, 0.3)
        cache_config(s, v, "0.65")
        transfers(s, v, "store", store, store / 25e9)
        transfers(s, v, "load", load, load / 25e9)
        if capacity is not None:
            sidecar_gauge(s, "kvoffload_cpu_capacity_bytes", capacity)
        return s.items

    fire = [(VLLM_LABELS, "0%")]
    return [
        Case(
            "LowPrefixReuse: fires on stores without loads (flat and mirrored names)",
            alert,
            workload(BASE),
            fire,
        ),
        Case(
            "LowPrefixReuse: deprecated transfer_type names only, no load series yet",
            alert,
            workload(LEGACY),
            fire,
        ),
        Case("LowPrefixReuse: escaped vllm_ names", alert, workload(ESCAPED), fire),
        Case("LowPrefixReuse: survives a counter reset", alert, workload(RESET), fire),
        Case(
            "LowPrefixReuse: fires when the tier fills within the window",
            alert,
            workload(BASE, capacity=0.65 * 2**30),
            fire,
        ),
        Case(
            "LowPrefixReuse: low reuse, not zero",
            alert,
            workload(BASE, load=18e6),
            [(VLLM_LABELS, "3%")],
        ),
        Case(
            "LowPrefixReuse: quiet when half of the stores come back",
            alert,
            workload(BASE, load=300e6),
            [],
        ),
        # 0.7 MB/s of stores is under the 1 MB/s floor; adding the deprecated mirror to the
        # flat series would double it past the floor.
        Case(
            "LowPrefixReuse: flat and mirrored names are not added together",
            alert,
            workload(BASE, store=42e6),
            [],
        ),
        Case(
            "LowPrefixReuse: quiet while the tier keeps blocks longer than the window",
            alert,
            workload(BASE, capacity=64 * 2**30),
            [],
        ),
        Case("LowPrefixReuse: quiet when idle", alert, workload(BASE, store=0.0), []),
    ]


def slower_than_recompute() -> list[Case]:
    alert = "KVOffloadSlowerThanRecompute"

    def workload(
        effect: float | None, bound: str = "estimate", low: float | None = None
    ) -> list[dict[str, str]]:
        # The sidecar's measured TTFT effect of the tier (seconds per request) and the low end
        # of its range: the alert reads nothing else (the fit over scrape intervals is the
        # sidecar's). The low end defaults to a clear cost (a range of ±10 ms around it).
        s = Series()
        up(s)
        if effect is not None:
            bounds = {bound: effect}
            if bound == "estimate":
                bounds["low"] = effect - 0.010 if low is None else low
            for name, value in bounds.items():
                s.add(
                    "kvoffload_offload_ttft_effect_seconds",
                    f"{_n(value)}+0x{MINUTES}",
                    job="kvoffload",
                    instance=SIDECAR,
                    target=INSTANCE,
                    model_name=MODEL,
                    bound=name,
                )
        return s.items

    fired = {
        "job": "kvoffload",
        "instance": INSTANCE,
        "target": INSTANCE,
        "model_name": MODEL,
        "bound": "estimate",
    }
    return [
        Case(
            "SlowerThanRecompute: fires when the tier costs 24 ms of mean TTFT",
            alert,
            workload(0.024),
            [(fired, "24ms")],
        ),
        Case("SlowerThanRecompute: quiet when the tier saves 38 ms", alert, workload(-0.038), []),
        Case(
            "SlowerThanRecompute: quiet on a cost under the 5 ms threshold",
            alert,
            workload(0.003),
            [],
        ),
        Case(
            "SlowerThanRecompute: quiet on a cost within its noise (the range's low end < 0)",
            alert,
            workload(0.024, low=-0.004),
            [],
        ),
        Case(
            "SlowerThanRecompute: only the estimate counts, not the range's high end",
            alert,
            workload(0.030, bound="high"),
            [],
        ),
        Case(
            "SlowerThanRecompute: quiet without the sidecar's effect (offloading off)",
            alert,
            workload(None),
            [],
        ),
    ]


def buffer_too_small() -> list[Case]:
    alert = "KVOffloadBufferTooSmall"

    def workload(
        v: Variant,
        cpu: float = 4733,
        gpu: float = 2336,
        failures: float | None = None,
        failure_values: str | None = None,
    ) -> list[dict[str, str]]:
        s = Series()
        serving(s, v, 120_000, 0.3)
        cache_config(s, v, "0.65")
        transfers(s, v, "store", 600e6, 0.024)
        sidecar_gauge(s, "kvoffload_cpu_capacity_tokens", cpu)
        sidecar_gauge(s, "kvoffload_gpu_capacity_tokens", gpu)
        if failures is not None:
            vllm_counter(s, v, "kv_offload_allocation_failure_total", failures)
        if failure_values is not None:
            for e in v.engines:
                s.add(
                    f"vllm{v.spelling}kv_offload_allocation_failure_total",
                    failure_values,
                    **_engine(v, e),
                )
        return s.items

    capacity_labels = {
        "job": "kvoffload",
        "instance": INSTANCE,
        "target": INSTANCE,
        "model_name": MODEL,
        "reason": "capacity",
    }
    failure_labels = {**VLLM_LABELS, "reason": "allocation_failures"}
    alloc_rule = "model_name:vllm_kv_offload_allocation_failure:rate5m"
    return [
        Case(
            "BufferTooSmall: fires when the CPU tier is not larger than GPU KV",
            alert,
            workload(BASE, cpu=2000),
            [(capacity_labels, "85.62%")],
        ),
        Case(
            "BufferTooSmall: names the size the sidecar advises",
            alert,
            with_advised_size(workload(BASE, cpu=2000), 24 * 2**30),
            [(capacity_labels, "85.62%")],
        ),
        Case(
            "BufferTooSmall: fires on allocation failures",
            alert,
            workload(BASE, failures=30),
            [(failure_labels, "0.50")],
        ),
        Case(
            "BufferTooSmall: escaped vllm_ names",
            alert,
            workload(ESCAPED, failures=30),
            [(failure_labels, "0.50")],
        ),
        Case(
            "BufferTooSmall: allocation failures still rising after a counter reset",
            alert,
            workload(RESET, failures=30),
            [(failure_labels, "0.50")],
        ),
        Case(
            "BufferTooSmall: a counter reset alone is not a failure",
            alert,
            workload(BASE, failure_values=f"100+0x120 0+0x{MINUTES - 121}"),
            [],
            exprs=[(alloc_rule, [({"__name__": alloc_rule, **VLLM_LABELS}, 0)])],
        ),
        Case(
            "BufferTooSmall: deprecated names only, no failure family: rate 0",
            alert,
            workload(LEGACY),
            [],
            exprs=[(alloc_rule, [({"__name__": alloc_rule, **VLLM_LABELS}, 0)])],
        ),
        Case(
            "BufferTooSmall: quiet when the tier is twice GPU KV and stores succeed",
            alert,
            workload(BASE, failures=0),
            [],
        ),
    ]


def buffer_oversized() -> list[Case]:
    alert = "KVOffloadBufferOversized"

    def workload(
        v: Variant, store: float = 6e6, tokens: float = 1200, capacity: float = 100 * 2**30
    ) -> list[dict[str, str]]:
        s = Series()
        serving(s, v, tokens, 0.3)
        cache_config(s, v, "100")
        transfers(s, v, "store", store, store / 20e9)
        sidecar_gauge(s, "kvoffload_cpu_capacity_bytes", capacity)
        return s.items

    fill = "model_name:kvoffload_cpu_fill_seconds:ratio_rate1h"
    fire = [(VLLM_LABELS, "12d 10h 15m 41s")]
    return [
        Case(
            "BufferOversized: fires when filling the tier takes more than a day",
            alert,
            workload(BASE),
            fire,
            exprs=[(fill, [({"__name__": fill, **VLLM_LABELS}, 100 * 2**30 / 1e5)])],
        ),
        Case(
            "BufferOversized: names the size the sidecar advises",
            alert,
            with_advised_size(workload(BASE), 3 * 2**30),
            fire,
        ),
        Case("BufferOversized: deprecated transfer_type names", alert, workload(LEGACY), fire),
        Case("BufferOversized: escaped vllm_ names", alert, workload(ESCAPED), fire),
        Case("BufferOversized: survives a counter reset", alert, workload(RESET), fire),
        Case(
            "BufferOversized: quiet when the tier fills in minutes",
            alert,
            workload(BASE, store=6e9),
            [],
        ),
        Case(
            "BufferOversized: quiet under the traffic floor", alert, workload(BASE, tokens=300), []
        ),
        # The advisor's `shrink` needs a tier that was never full (conditions.OVERSIZED):
        # 200 GiB stored since the engine started into a 100 GiB tier, then traffic fell.
        Case(
            "BufferOversized: quiet when the tier has been full before",
            alert,
            _stored_before(workload(BASE), 200 * 2**30),
            [],
        ),
        Case(
            "BufferOversized: quiet when idle (no stores, fill time undefined)",
            alert,
            workload(BASE, store=0, tokens=0),
            [],
        ),
    ]


def transfer_slow() -> list[Case]:
    alert = "KVOffloadTransferSlow"

    def workload(v: Variant, load: float = 8.84736e9, seconds: float = 6.0) -> list[dict[str, str]]:
        s = Series()
        serving(s, v, 720_000, 0.1, external=60_000, compute_seconds_per_min=30)
        cache_config(s, v, "0.65")
        transfers(s, v, "load", load, seconds)
        transfers(s, v, "store", load, seconds)
        return s.items

    fire = [(VLLM_LABELS, "1.475G")]
    return [
        Case("TransferSlow: fires when loads run at 1.5 GB/s", alert, workload(BASE), fire),
        Case("TransferSlow: deprecated transfer_type names", alert, workload(LEGACY), fire),
        Case("TransferSlow: escaped vllm_ names", alert, workload(ESCAPED), fire),
        Case("TransferSlow: survives a counter reset", alert, workload(RESET), fire),
        Case("TransferSlow: ratio of sums over two engines", alert, workload(TWO_ENGINES), fire),
        Case("TransferSlow: quiet at 14.7 GB/s", alert, workload(BASE, seconds=0.6), []),
        Case(
            "TransferSlow: quiet under the load traffic floor",
            alert,
            workload(BASE, load=30e6, seconds=0.1),
            [],
        ),
        Case("TransferSlow: quiet when idle", alert, workload(BASE, load=0, seconds=0), []),
    ]


def metrics_missing() -> list[Case]:
    alert = "KVOffloadMetricsMissing"

    def workload(
        v: Variant,
        size: str = "0.65",
        tokens: float = 120_000,
        up_value: int = 1,
        with_up: bool = True,
        vllm_metrics: bool = True,
    ) -> list[dict[str, str]]:
        s = Series()
        if vllm_metrics:
            serving(s, v, tokens, 0.3)
            cache_config(s, v, size)
            transfers(s, v, "store", 600e6 if tokens else 0, 0.024 if tokens else 0)
        if with_up:
            up(s, up_value)
        return s.items

    missing = {"job": "vllm", "instance": INSTANCE, "reason": "offload_series_missing"}
    return [
        Case(
            "MetricsMissing: offloading configured, traffic, no offload series",
            alert,
            workload(OFF),
            [(missing, "1")],
        ),
        Case(
            "MetricsMissing: escaped vllm_ names",
            alert,
            workload(replace(OFF, spelling="_")),
            [(missing, "1")],
        ),
        Case(
            "MetricsMissing: survives a counter reset",
            alert,
            workload(replace(OFF, reset=True)),
            [(missing, "1")],
        ),
        Case(
            "MetricsMissing: the vLLM target is down",
            alert,
            workload(OFF, up_value=0, vllm_metrics=False),
            [({"job": "vllm", "instance": INSTANCE, "reason": "target_down"}, "0")],
        ),
        Case(
            "MetricsMissing: no vLLM target is scraped",
            alert,
            workload(OFF, with_up=False, vllm_metrics=False),
            [({"job": "vllm", "reason": "target_absent"}, "1")],
        ),
        Case(
            "MetricsMissing: the target is up without vLLM engine metrics",
            alert,
            workload(OFF, vllm_metrics=False),
            [({"job": "vllm", "instance": INSTANCE, "reason": "no_vllm_metrics"}, "1")],
        ),
        Case(
            "MetricsMissing: quiet with flat offload series",
            alert,
            workload(Variant(offload="flat")),
            [],
        ),
        Case("MetricsMissing: quiet with deprecated offload series", alert, workload(LEGACY), []),
        Case(
            "MetricsMissing: quiet when offloading is not configured",
            alert,
            workload(OFF, size="None"),
            [],
        ),
        Case(
            "MetricsMissing: quiet when idle (series appear with the first transfer)",
            alert,
            workload(LEGACY, tokens=0),
            [],
        ),
    ]


def exporter_target_down() -> list[Case]:
    alert = "KVOffloadExporterTargetDown"

    def workload(values: str) -> list[dict[str, str]]:
        s = Series()
        s.add("kvoffload_up", values, job="kvoffload", instance=SIDECAR, target=INSTANCE)
        return s.items

    labels = {"job": "kvoffload", "instance": SIDECAR, "target": INSTANCE}
    return [
        Case(
            "ExporterTargetDown: fires when the sidecar cannot scrape vLLM",
            alert,
            workload(f"1+0x100 0+0x{MINUTES - 101}"),
            [(labels, "0")],
        ),
        Case(
            "ExporterTargetDown: quiet on a short blip",
            alert,
            workload(f"1+0x141 0+0x5 1+0x{MINUTES - 147}"),
            [],
        ),
        Case(
            "ExporterTargetDown: quiet while scrapes succeed", alert, workload(f"1+0x{MINUTES}"), []
        ),
    ]


def host_memory_near_limit() -> list[Case]:
    alert = "KVOffloadHostMemoryNearLimit"
    gib = 2**30

    def workload(held: str, limit: float | None) -> list[dict[str, str]]:
        s = Series()
        where = {"job": "kvoffload", "instance": SIDECAR}
        s.add("kvoffload_host_memory_unreclaimable_bytes", held, **where)
        if limit is not None:
            s.add("kvoffload_host_memory_limit_bytes", f"{_n(limit)}+0x{MINUTES}", **where)
        return s.items

    labels = {"job": "kvoffload", "instance": SIDECAR}
    # 30 GiB held (a 16 GiB tier pinned as 28 GiB + the engine) under a 32 GiB limit: 93.75%.
    return [
        Case(
            "HostMemoryNearLimit: fires when the pinned tier fills the container's limit",
            alert,
            workload(f"{_n(8 * gib)}+0x100 {_n(30 * gib)}+0x{MINUTES - 101}", 32 * gib),
            [(labels, "93.75%")],
        ),
        Case(
            "HostMemoryNearLimit: quiet with room to spare",
            alert,
            workload(f"{_n(16 * gib)}+0x{MINUTES}", 32 * gib),
            [],
        ),
        Case(
            "HostMemoryNearLimit: quiet on a short peak",
            alert,
            workload(
                f"{_n(16 * gib)}+0x146 {_n(31 * gib)}+0x2 {_n(16 * gib)}+0x{MINUTES - 149}",
                32 * gib,
            ),
            [],
        ),
        Case(
            "HostMemoryNearLimit: quiet without a limit",
            alert,
            workload(f"{_n(30 * gib)}+0x{MINUTES}", None),
            [],
        ),
    ]


def sidecar_down() -> list[Case]:
    alert = "KVOffloadSidecarDown"

    def workload(values: str | None) -> list[dict[str, str]]:
        s = Series()
        up(s)  # vLLM itself is scraped throughout
        if values is not None:
            s.add("up", values, job="kvoffload", instance=SIDECAR)
        return s.items

    return [
        Case(
            "SidecarDown: fires when Prometheus cannot scrape the sidecar",
            alert,
            workload(f"1+0x100 0+0x{MINUTES - 101}"),
            [({"job": "kvoffload", "instance": SIDECAR, "reason": "sidecar_down"}, "0")],
        ),
        Case(
            "SidecarDown: fires when no sidecar is scraped at all",
            alert,
            workload(None),
            [({"job": "kvoffload", "reason": "sidecar_absent"}, "1")],
        ),
        Case("SidecarDown: quiet while it is scraped", alert, workload(f"1+0x{MINUTES}"), []),
        Case(
            "SidecarDown: quiet on a short blip",
            alert,
            workload(f"1+0x141 0+0x5 1+0x{MINUTES - 147}"),
            [],
        ),
    ]


def all_cases() -> list[Case]:
    return [
        *recommend_enable(),
        *low_prefix_reuse(),
        *slower_than_recompute(),
        *buffer_too_small(),
        *buffer_oversized(),
        *transfer_slow(),
        *metrics_missing(),
        *exporter_target_down(),
        *host_memory_near_limit(),
        *sidecar_down(),
    ]


def build(cfg: MixinConfig | None = None) -> str:
    cfg = cfg or MixinConfig()
    rules = _alert_rules(cfg)
    doc = {
        "rule_files": [f"../{RULES_FILE}", f"../{ALERTS_FILE}"],
        "evaluation_interval": "5m",
        "tests": [to_test(c, rules) for c in all_cases()],
    }
    return (
        "# Generated by tests/rules/promtool_cases.py: every alert fires on its bad case and\n"
        "# stays quiet on the good and idle ones, on flat and deprecated offload names, on\n"
        "# the escaped vllm_ spelling, across counter resets.\n"
        "# Run: promtool test rules alerts/tests/kvoffload-alerts.test.yaml\n" + to_yaml(doc)
    )


def main() -> None:
    TEST_FILE.parent.mkdir(parents=True, exist_ok=True)
    TEST_FILE.write_text(build())
    print(f"wrote {TEST_FILE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
