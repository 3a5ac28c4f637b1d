"""The recording rules and dashboards in a real Prometheus, against the sidecar's Python.

One live run (module fixture, ~40 s) with three fake vLLM targets:
- `h200`: the real H200 capture (vLLM 0.26, Qwen3-8B shapes, offloading on: flat *and*
  deprecated offload names, as vLLM serves them), lightly augmented (see `augmented`);
- `escaped`: the same bodies with escaped `vllm_` names and only the deprecated
  `transfer_type` series (vLLM ≤ 0.23 as Prometheus 2 stores it through OpenMetrics);
- `sim`: the simulator's `dp2` scenario with 2 GiB CPU tiers and an fs tier below each
  (vLLM 0.33 names: tier-attributed cached tokens, kv_offload_config_info, the tiering
  series; two data-parallel engines), rendered at 30 virtual seconds per body.
Prometheus scrapes them and the kvoffload sidecar every 0.1 s and evaluates the generated
rules with 30 s windows; the sidecar scrapes `h200` and `sim` with a 30 s window. A second
Prometheus scrapes the same targets without the rules (a dashboard imported first): the
dashboards' queries run on both.

Timeline: the first bodies are held for a few seconds, then 20 more follow every 0.5 s, then
the last are held. At the moment of comparison both windows start before the first change and
end after the last, so every counter increase is identical in both systems; per-second
figures differ only by each system's sample span (≤ 0.5 s of 30 s, under 2%).
"""

from __future__ import annotations

import asyncio
import math
import re
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvoffload.analysis.analyze import Settings
from kvoffload.analysis.signals import FIGURES, PER_TIER_FIGURES, per_tier_metric
from kvoffload.kvevents.decode import Batch, decode_batch
from kvoffload.kvevents.state import TargetEvents
from kvoffload.mixin import dashboards, rules
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.dashboards.panels import ACTION_CODES, ACTION_MAPPINGS, BASIS_CODES
from kvoffload.mixin.renderings import NOT_IN_PROMQL, RENDERINGS, rendering_for
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.kv_events import encode_batch
from kvoffload.thresholds import Thresholds

from helpers import h200_scrapes
from rules_procs import PromAPI, body_app, prometheus, serve

WINDOW = 30.0
INTERVAL = 0.1  # scrape interval of Prometheus and the sidecar: the rate figures' error bound
START = 4  # batch1-5-A-resent: the first body where flat load and store series both exist
STEP = 0.5
HOLD = 5.0
MODEL = "qwen3-8b-dummy"
SIM_SCENARIO = "dp2"
# ... with its CPU tiers cut to 2 GiB and an fs tier below each (as in the `tiered` scenario),
# so the secondary-tier figures are compared on the simulator too.
SIM = replace(
    scenarios.get(SIM_SCENARIO),
    cpu_gib=2.0,
    secondary_tier="fs",
    secondary_gib=32.0,
    secondary_read_gbps=6.0,
)
SIM_WARMUP = 300.0  # virtual seconds before the first body: caches warm, all series exist
SIM_STEP = 30.0  # virtual seconds per body
CFG = MixinConfig(rate_window="30s", slow_window="30s")
TOLERANCE = 0.02
# The overview's stats that pool a ratio over the selection (PanelQueries.pooled).
POOLED_KEYS = ("offload_hit_ratio", "reuse_ratio", "speedup")
# Means of gauges over the window: each side averages the samples its own scraper took, at
# its own moments, of a value the replay changes every STEP — they agree on the formula, not
# on the sampling instants. (On the H200 target these gauges are constant and match exactly.)
GAUGE_MEANS = {
    "gpu_kv_usage_ratio",
    "waiting_for_capacity",
    "tier_active_promotions",
    "tier_active_cascades",
}
GAUGE_MEAN_TOLERANCE = 0.10
# ... and near zero (the simulator's GPU KV usage is ~0.005, non-zero only during prefills) a
# relative bound means little: one percentage point of a ratio, or 0.01 requests, also agrees.
GAUGE_MEAN_ABSOLUTE = 0.01


FAILURES = """# HELP vllm:kv_offload_allocation_failure_total Number of failed CPU allocations.
# TYPE vllm:kv_offload_allocation_failure_total counter
vllm:kv_offload_allocation_failure_total{{engine="0",model_name="{model}"}} {n}.0
"""


# Two secondary tiers below the CPU tier, as TieringOffloadingSpec labels them (written from
# vLLM's tiering/base.py and tiering/metrics.py: the real capture has no tier): their series
# are added over tiers in both renderings.
CHUNK = 2_359_296  # one Qwen3-8B block of 16 tokens, the capture's chunk


def tiering(i: int) -> str:
    """The two tiers' series at scrape i (counters grow with i; the gauges are constant)."""
    half = i // 2
    series: dict[tuple[str, str], dict[str, float]] = {
        ("chunk_queries_total", "counter"): {"0:primary": 10 * i, "1:fs": 4 * i, "2:obj": i},
        ("chunk_hits_total", "counter"): {"0:primary": 6 * i, "1:fs": 3 * i, "2:obj": half},
        ("read_bytes_total", "counter"): {"1:fs": 3 * i * CHUNK, "2:obj": half * CHUNK},
        ("read_time_total", "counter"): {"1:fs": 0.0012 * i, "2:obj": 0.004 * half},
        ("write_bytes_total", "counter"): {"1:fs": 5 * i * CHUNK, "2:obj": 5 * i * CHUNK},
        ("write_time_total", "counter"): {"1:fs": 0.008 * i, "2:obj": 0.008 * i},
        ("promotion_job_failures_total", "counter"): {"2:obj": i // 4},
        ("active_promotion_jobs", "gauge"): {"1:fs": 1.0, "2:obj": 0.0},
        ("active_cascade_jobs", "gauge"): {"1:fs": 2.0, "2:obj": 1.0},
    }
    lines = []
    for (name, kind), by_tier in series.items():
        full = f"vllm:kv_offload_tiering_{name}"
        lines.append(f"# TYPE {full} {kind}")
        for tier, value in by_tier.items():
            labels = f'engine="0",model_name="{MODEL}",tier="{tier}"'
            lines.append(f"{full}{{{labels}}} {float(value)!r}")
    # vLLM 0.26.0's two per-request histograms (no tier label; only _sum and _count are read):
    # 2 requests a scrape, blocked 0.3 ms and waiting 25 ms each
    for name, seconds in (("sync", 3e-4), ("async", 0.025)):
        full = f"vllm:kv_offload_tiering_lookup_{name}_delay_seconds"
        labels = f'engine="0",model_name="{MODEL}"'
        lines.append(f"# TYPE {full} histogram")
        lines.append(f'{full}_bucket{{{labels},le="+Inf"}} {float(2 * i)!r}')
        lines.append(f"{full}_sum{{{labels}}} {2 * i * seconds!r}")
        lines.append(f"{full}_count{{{labels}}} {float(2 * i)!r}")
    return "\n".join(lines) + "\n"


def augmented(body: str, i: int) -> str:
    """The real capture had no KV pressure, no allocation failures and no secondary tier; add
    some (GPU KV usage 0.42, 2 requests waiting for capacity, one preemption and three
    failures per scrape, two tiers below the CPU: `tiering`), so those figures are compared
    on something other than zero, and the advice carries a size (grow)."""
    body = re.sub(r"^(vllm:kv_cache_usage_perc\{.*\}) 0\.0$", r"\1 0.42", body, flags=re.M)
    body = re.sub(
        r'^(vllm:num_requests_waiting_by_reason\{.*reason="capacity"\}) 0\.0$',
        r"\1 2.0",
        body,
        flags=re.M,
    )
    body = re.sub(r"^(vllm:num_preemptions_total\{.*\}) 0\.0$", rf"\1 {i}.0", body, flags=re.M)
    return body + FAILURES.format(model=MODEL, n=3 * i) + tiering(i)


def escaped_legacy(body: str) -> str:
    """The same scrape as a vLLM ≤ 0.23 stored by Prometheus 2 via OpenMetrics: no flat
    offload families, colons escaped; the tiers' lookups under their first spelling
    (`block_*`, before vLLM renamed them `chunk_*`)."""
    kept = [
        line
        for line in body.splitlines()
        if not re.match(r"^(# (HELP|TYPE) )?vllm:kv_offload_(load|store)_", line)
    ]
    text = "\n".join(kept).replace("vllm:", "vllm_") + "\n"
    return text.replace("vllm_kv_offload_tiering_chunk_", "vllm_kv_offload_tiering_block_")


def event_batches(n: int) -> list[list[Batch]]:
    """n slices of a simulator run's KV events (Qwen3-8B shapes, like the H200 target's, and
    a reuse set far larger than its 0.65 GiB tier: the curve says grow), fed to
    the sidecar as if subscribed, so the KV-event panels have moving counters."""
    sim = SimServer(scenarios.get("buffer-too-small"), kv_events=True)
    slices = []
    for k in range(n):
        sim.advance_to(60.0 * (k + 1))
        slices.append(
            [decode_batch(encode_batch(ts, evs, rank)) for rank, ts, evs in sim.drain_kv_events()]
        )
    return slices


def sim_bodies(n: int) -> list[str]:
    sim = SimServer(SIM, seed=0)
    out = []
    for k in range(n):
        sim.advance_to(SIM_WARMUP + SIM_STEP * k)
        out.append(sim.render().decode())
    return out


@dataclass
class Live:
    flat: str  # the H200 replay: flat + deprecated names; a sidecar target
    escaped: str  # the same data, escaped and deprecated-only names
    sim: str  # the simulator's 0.33, DP=2 replay; a sidecar target
    at: float
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    sidecar: list[dict[str, Any]] = field(default_factory=list)
    panels: list[tuple[str, str, str, int]] = field(default_factory=list)
    variables: list[tuple[str, str, int]] = field(default_factory=list)
    rule_health: list[tuple[str, str, str]] = field(default_factory=list)
    # The same dashboards on a second Prometheus scraping the same targets without the rules.
    bare_panels: list[tuple[str, str, str, int]] = field(default_factory=list)
    bare_variables: list[tuple[str, str, int]] = field(default_factory=list)
    bare_rules: int = -1
    # Panels reading series only some vLLM versions export, queried on the simulator (0.33).
    only_where: list[tuple[str, str, str, int]] = field(default_factory=list)
    # (prometheus "rules" or "bare", dashboard, panel, refId) → the query's samples.
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = field(default_factory=dict)
    # Figure key → the overview's pooled stat at one instance and at all of them.
    pooled: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(
        default_factory=dict
    )
    # (prometheus, dashboard, annotation) → its query's samples at `at` (valid PromQL).
    annotations: dict[tuple[str, str, str], list[dict[str, Any]]] = field(default_factory=dict)


def _every(expr: str, live: Live) -> str:
    """`expr` with every variable on All: every instance and every model."""
    return _substitute(expr, live, ".+").replace(f'model_name=~"{MODEL}"', 'model_name=~".+"')


def _substitute(expr: str, live: Live, instance: str | None = None) -> str:
    values = {
        "job": "vllm",
        "instance": instance or live.flat,
        "model_name": MODEL,
        "engine": "0",
        "__rate_interval": "30s",
    }
    # Grafana leaves `$1` (a label_replace replacement) alone: no variable has that name.
    return re.sub(r"\$\{?([a-z_]\w*)\}?", lambda m: values[m.group(1)], expr)


async def _collect(api: PromAPI, live: Live) -> None:
    names = sorted({str(r["record"]) for r in rules.recording_rules(CFG)})
    for name in names:
        live.records[name] = await api.query(name, live.at)
    live.sidecar = await api.query('{__name__=~"kvoffload_.+", job="kvoffload"}', live.at)
    queries = dashboards.PanelQueries(CFG, per_engine=True)
    for key in POOLED_KEYS:
        pooled = queries.pooled(key)
        live.pooled[key] = (
            await api.query(_substitute(pooled, live), live.at),
            await api.query(_every(pooled, live), live.at),
        )
    await _collect_dashboards(api, live, live.panels, live.variables)
    live.rule_health = [(r["name"], r["health"], r.get("lastError", "")) for r in await api.rules()]


async def _collect_dashboards(
    api: PromAPI,
    live: Live,
    panels_out: list[tuple[str, str, str, int]],
    variables_out: list[tuple[str, str, int]],
) -> None:
    """Every panel query's series count and every variable's value count, at `live.at`."""
    tag = "rules" if panels_out is live.panels else "bare"
    for build in (dashboards.overview, dashboards.fleet):
        d = build(CFG)
        for a in d["annotations"]["list"]:
            if "expr" in a:
                got = await api.query(_substitute(a["expr"], live, ".+"), live.at)
                live.annotations[(tag, d["title"], a["name"])] = got
        # A collapsed row holds its panels: they are queried like the others.
        panels = [c for p in d["panels"] for c in (p, *p.get("panels", []))]
        for panel in panels:
            for target in panel.get("targets", []):
                expr = _substitute(target["expr"], live)
                result = await api.query(expr, live.at)
                live.results[(tag, d["title"], panel["title"], target["refId"])] = result
                panels_out.append((d["title"], panel["title"], expr, len(result)))
                if dashboards.ONLY_WHERE in panel["description"] and panels_out is live.panels:
                    expr = _substitute(target["expr"], live, live.sim)
                    result = await api.query(expr, live.at)
                    live.only_where.append((d["title"], panel["title"], expr, len(result)))
        for var in d["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            assert m, var["definition"]
            series = await api.series(_substitute(m.group(1), live))
            values = {s[m.group(2)] for s in series if m.group(2) in s}
            variables_out.append((d["title"], var["name"], len(values)))


async def _run(workdir: Path) -> Live:
    h200 = [augmented(body, i) for i, (_t, body) in enumerate(h200_scrapes("8b-offload"))]
    h200 = h200[START:]
    simulated = sim_bodies(len(h200))
    # A replica of the same model without a tier (Prometheus only): the replicas A/B rules.
    nooffload = [body for _t, body in h200_scrapes("8b-nooffload")][START:]
    state = {"i": 0}
    flat_app = body_app(lambda: h200[state["i"]])
    escaped_app = body_app(lambda: escaped_legacy(h200[state["i"]]))
    sim_app = body_app(lambda: simulated[state["i"]])
    nooffload_app = body_app(lambda: nooffload[min(state["i"], len(nooffload) - 1)])
    async with (
        serve(flat_app) as flat_port,
        serve(escaped_app) as escaped_port,
        serve(sim_app) as sim_port,
        serve(nooffload_app) as nooffload_port,
    ):
        flat, escaped = f"127.0.0.1:{flat_port}", f"127.0.0.1:{escaped_port}"
        sim = f"127.0.0.1:{sim_port}"
        replica = f"127.0.0.1:{nooffload_port}"
        # Thresholds that let the advisor speak on 30 s of data (a few dozen requests), and
        # count any TTFT saving that clears its range.
        settings = Settings(
            thresholds=Thresholds(
                min_window_seconds=1,
                min_prompt_tokens=1,
                min_requests=1,
                min_ttft_saving_seconds=0.0,
                min_ttft_saving_ratio=0.0,
            )
        )
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://{flat}/metrics", f"http://{sim}/metrics"],
                interval_seconds=INTERVAL,
                window_seconds=WINDOW,
                timeout_seconds=1.0,
                settings=settings,
                host_memory=str(_cgroup_fixture()),
            )
        )
        # KV events for the H200 target: fed directly (the ZMQ path is tested apart).
        events = TargetEvents()
        sidecar.events[flat] = events
        feed = event_batches(len(h200) + 1)
        seq = 0

        def ingest(batches: list[Batch]) -> None:
            nonlocal seq
            for batch in batches:
                events.ingest(batch, seq, 0)
                seq += 1

        ingest(feed[0])
        async with serve(make_app(sidecar)) as sidecar_port:
            config = {
                "global": {
                    "scrape_interval": f"{INTERVAL * 1000:.0f}ms",
                    "scrape_timeout": f"{INTERVAL * 1000:.0f}ms",
                    "evaluation_interval": "250ms",
                },
                "scrape_configs": [
                    {
                        "job_name": "vllm",
                        "static_configs": [{"targets": [flat, escaped, sim, replica]}],
                    },
                    {
                        "job_name": "kvoffload",
                        "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}],
                    },
                ],
            }
            files = rules.render(CFG)
            rule_files = {n: files[n] for n in (rules.RULES_FILE, rules.ALERTS_FILE)}
            async with (
                prometheus(workdir, config, rule_files) as url,
                prometheus(workdir / "bare", config, {}) as bare_url,
                aiohttp.ClientSession() as session,
            ):
                api = PromAPI(session, url)
                bare = PromAPI(session, bare_url)
                await api.wait_for("up == 1", 4)
                await bare.wait_for("up == 1", 4)
                await asyncio.sleep(HOLD)
                first_change = time.time()
                for i in range(1, len(h200)):
                    state["i"] = i
                    ingest(feed[i])
                    await asyncio.sleep(STEP)
                # Both windows start 3 s before the first change and end well after the last.
                live = Live(flat, escaped, sim, at=first_change + WINDOW - 3.0)
                assert live.at > time.time() + 1.0, "the replay took longer than planned"
                await asyncio.sleep(live.at - time.time() + 2 * INTERVAL)
                await _collect(api, live)
                await _collect_dashboards(bare, live, live.bare_panels, live.bare_variables)
                live.bare_rules = len(await bare.rules())
                return live


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Live:
    return asyncio.run(_run(tmp_path_factory.mktemp("prometheus")))


def _by_instance(samples: list[dict[str, Any]], instance: str) -> list[dict[str, Any]]:
    return [s for s in samples if s["metric"].get("instance") == instance]


def _close(a: float, b: float, tolerance: float = TOLERANCE) -> bool:
    if math.isclose(a, 0.0, abs_tol=1e-12) or math.isclose(b, 0.0, abs_tol=1e-12):
        return math.isclose(a, b, abs_tol=1e-9)
    return math.isclose(a, b, rel_tol=tolerance)


def _cgroup_fixture() -> Path:
    """vLLM's container as a cgroup v2 directory: the host-memory panels and rules read it."""
    d = Path(tempfile.mkdtemp(prefix="kvo-cgroup-"))
    (d / "memory.current").write_text(f"{20 * 2**30}\n")
    (d / "memory.max").write_text(f"{64 * 2**30}\n")
    (d / "memory.stat").write_text(f"anon {2 * 2**30}\nfile {17 * 2**30}\nshmem {15 * 2**30}\n")
    (d / "memory.events").write_text("oom 0\noom_kill 0\n")
    return d


@pytest.mark.slow
def test_prometheus_loads_every_rule_and_evaluates_it_without_error(live: Live) -> None:
    assert len(live.rule_health) == len(rules.recording_rules(CFG)) + len(rules.alerting_rules(CFG))
    bad = [r for r in live.rule_health if r[1] != "ok"]
    assert not bad, bad


def test_every_recording_rule_returns_data_for_every_target(live: Live) -> None:
    sidecar_joined = {
        r.record(CFG, w)
        for r in RENDERINGS
        if r.metric.startswith("kvoffload_")
        for w in r.windows or (None,)
    }
    for name, samples in live.records.items():
        if ":replica_" in name:
            continue  # per model, over every replica: test_replicas_ab_rules
        assert _by_instance(samples, live.flat), f"{name}: no data for the H200 replay"
        assert _by_instance(samples, live.sim), f"{name}: no data for the simulator"
        if name not in sidecar_joined:  # no sidecar watches the escaped target
            assert _by_instance(samples, live.escaped), f"{name}: no data for escaped names"
        for s in samples:
            assert math.isfinite(float(s["value"][1])), (name, s)


def test_every_recording_rule_equals_the_sidecar_figure(live: Live) -> None:
    groups = {
        (s["metric"]["target"], s["metric"]["model_name"])
        for s in live.sidecar
        if s["metric"]["__name__"] == "kvoffload_window_seconds"
    }
    assert {t for t, _m in groups} == {live.flat, live.sim}
    compared = set()
    for target, model in sorted(groups):
        sidecar = {
            (s["metric"]["__name__"], s["metric"].get("source")): float(s["value"][1])
            for s in live.sidecar
            if s["metric"].get("target") == target and s["metric"].get("model_name") == model
        }
        for fig in FIGURES:
            if fig.key in NOT_IN_PROMQL:
                continue
            rendering = rendering_for(fig.key)
            labels = dict(fig.labels)
            want = sidecar.get((fig.metric, labels.get("source")))
            for which in rendering.windows or (None,):
                name = rendering.record(CFG, which)
                got = [
                    float(s["value"][1])
                    for s in _by_instance(live.records[name], target)
                    if s["metric"].get("model_name") == model
                    and all(s["metric"].get(k) == v for k, v in labels.items())
                ]
                where = f"{fig.key} on {target} ({model}): rule {name}"
                # Undefined is absent in both renderings.
                assert (want is None) == (not got), f"{where} = {got}, sidecar {want}"
                if want is None:
                    continue
                assert len(got) == 1, (where, got)
                if fig.key in GAUGE_MEANS:
                    agree = (
                        _close(got[0], want, GAUGE_MEAN_TOLERANCE)
                        or abs(got[0] - want) <= GAUGE_MEAN_ABSOLUTE
                    )
                else:
                    agree = _close(got[0], want)
                assert agree, f"{where} = {got[0]!r}, sidecar {want!r}"
                compared.add((target, fig.key))
    # Every figure the catalog has is either compared on both sources or not PromQL-able.
    for target, _model in groups:
        keys = {k for t, k in compared if t == target}
        assert keys | set(NOT_IN_PROMQL) == {f.key for f in FIGURES}, (
            target,
            {f.key for f in FIGURES} - keys - set(NOT_IN_PROMQL),
        )


def test_every_per_tier_rule_equals_the_sidecar_per_tier_figure(live: Live) -> None:
    """model_name_tier:* against kvoffload_tier_*{tier}: each secondary tier apart, on the
    replay's two tiers (1:fs, 2:obj) and the simulator's fs tier."""
    compared = set()
    for fig in PER_TIER_FIGURES:
        summed = rendering_for(fig.key)
        name = summed.record(CFG, "fast").replace("model_name:", "model_name_tier:", 1)
        for s in live.sidecar:
            if s["metric"]["__name__"] != per_tier_metric(fig):
                continue
            target, tier = s["metric"]["target"], s["metric"]["tier"]
            got = [
                float(r["value"][1])
                for r in _by_instance(live.records[name], target)
                if r["metric"].get("tier") == tier
                and r["metric"].get("model_name") == s["metric"]["model_name"]
            ]
            assert len(got) == 1, (name, target, tier, got)
            assert _close(got[0], float(s["value"][1])), (name, target, tier, got, s["value"])
            compared.add((target, tier))
    assert {(live.flat, "1:fs"), (live.flat, "2:obj")} <= compared, compared
    assert any(t == live.sim for t, _ in compared), compared


def test_escaped_deprecated_names_give_the_same_figures(live: Live) -> None:
    for name, samples in live.records.items():
        flat = {_key(s): float(s["value"][1]) for s in _by_instance(samples, live.flat)}
        escaped = {_key(s): float(s["value"][1]) for s in _by_instance(samples, live.escaped)}
        for key, value in escaped.items():
            assert key in flat, (name, key)
            assert _close(value, flat[key]), f"{name}{dict(key)}: {value} vs {flat[key]}"


def _key(sample: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in sample["metric"].items() if k not in ("instance", "__name__"))
    )


def test_every_dashboard_query_returns_data(live: Live) -> None:
    """On the H200 replay (vLLM 0.26), except panels that say they read series only some
    versions export: those return data on the simulator's 0.33 names."""
    only = {(d, p) for d, p, _e, _n in live.only_where}
    empty = [(d, p, e) for d, p, e, n in live.panels if n == 0 and (d, p) not in only]
    assert not empty, "\n".join(f"{d} / {p}: {e}" for d, p, e in empty)
    assert len(live.panels) > 40
    assert only and all(n > 0 for *_x, n in live.only_where), live.only_where


def test_vllms_own_offload_diagnostics_return_data(live: Live) -> None:
    """The row of vLLM's own offload series (lookup delay, transfer sizes, pinned slots,
    failed stores, configuration) shows the H200 replay's engine."""
    d = dashboards.overview(CFG)
    (row,) = [p for p in d["panels"] if p["title"] == dashboards.DIAGNOSTICS_ROW]
    titles = {p["title"] for p in row["panels"]}
    got = {p: n for _d, p, _e, n in live.panels if p in titles}
    assert set(got) == titles
    only = {p for _d, p, _e, _n in live.only_where}
    assert all(n > 0 for p, n in got.items() if p not in only), got


def test_every_dashboard_variable_has_values(live: Live) -> None:
    assert live.variables
    assert all(n > 0 for _d, _v, n in live.variables), live.variables


def test_the_recommendation_reaches_prometheus_with_a_size(live: Live) -> None:
    rec = [
        s
        for s in live.sidecar
        if s["metric"]["__name__"] == "kvoffload_recommendation"
        and s["value"][1] == "1"
        and s["metric"]["target"] == live.flat
    ]
    # Allocation failures with a tier larger than GPU KV: the advisor says grow, with a size.
    assert [s["metric"]["action"] for s in rec] == ["grow"]
    size = [
        s
        for s in live.sidecar
        if s["metric"]["__name__"] == "kvoffload_recommended_size_bytes"
        and s["metric"]["target"] == live.flat
    ]
    assert size and float(size[0]["value"][1]) > 0


def test_replicas_ab_rules_compare_replicas_with_and_without_a_tier(live: Live) -> None:
    """The H200 model has replicas with a tier (the replay, flat and escaped names) and one
    without (8b-nooffload): mean TTFT per side and their difference, per model."""
    means = {
        s["metric"]["offloading"]: float(s["value"][1])
        for s in live.records[
            f"model_name:vllm_time_to_first_token_seconds:replica_mean_rate{CFG.slow_window}"
        ]
        if s["metric"]["model_name"] == MODEL
    }
    assert set(means) == {"on", "off"} and all(v > 0 for v in means.values())
    (effect,) = [
        float(s["value"][1])
        for s in live.records[
            f"model_name:vllm_time_to_first_token_seconds:replica_ab_rate{CFG.slow_window}"
        ]
        if s["metric"]["model_name"] == MODEL
    ]
    assert effect == pytest.approx(means["on"] - means["off"])


def _listed_as_needing_rules() -> set[tuple[str, str]]:
    """(dashboard, panel) of every panel whose description says it needs the rules."""
    out = set()
    for build in (dashboards.overview, dashboards.fleet):
        d = build(CFG)
        for p in d["panels"]:
            for c in (p, *p.get("panels", [])):
                if dashboards.NEEDS_RULES in c.get("description", ""):
                    out.add((d["title"], c["title"]))
    return out


def test_without_the_rules_every_panel_returns_data_or_says_it_needs_them(live: Live) -> None:
    """A Prometheus that never loaded the rules (import-only, the usual first step): each
    query falls back to the rule's own PromQL over vLLM's series, or its panel is listed."""
    assert live.bare_rules == 0
    assert len(live.bare_panels) == len(live.panels)
    # Panels on series only some versions export are held on the simulator apart.
    listed = _listed_as_needing_rules() | {(d, p) for d, p, _e, _n in live.only_where}
    empty = [(d, p, e) for d, p, e, n in live.bare_panels if n == 0 and (d, p) not in listed]
    assert not empty, "\n".join(f"{d} / {p}: {e}" for d, p, e in empty)


def test_without_the_rules_every_dashboard_variable_has_values(live: Live) -> None:
    assert len(live.bare_variables) == len(live.variables)
    assert all(n > 0 for _d, _v, n in live.bare_variables), live.bare_variables


def test_with_the_rules_a_fallback_adds_no_series(live: Live) -> None:
    """`rule or raw` with the rules loaded: the raw side has the rule's label sets, so the
    panels show as many series as on the rule-less Prometheus (no doubled legends)."""
    counts = {(d, p, e): n for d, p, e, n in live.bare_panels}
    doubled = [
        (d, p, n, counts[(d, p, e)])
        for d, p, e, n in live.panels
        if "\nor\n" in e and counts[(d, p, e)] and n != counts[(d, p, e)]
    ]
    assert not doubled, doubled


def _sidecar_value(live: Live, name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        s
        for s in live.sidecar
        if s["metric"]["__name__"] == name
        and s["metric"]["target"] == live.flat
        and all(s["metric"].get(k) == v for k, v in labels.items())
    ]


@pytest.mark.parametrize("prom", ["rules", "bare"])
def test_the_fleet_table_says_who_should_change(live: Live, prom: str) -> None:
    """ "Engines at a glance", with and without the rules: the H200 engine's row holds the
    sidecar's action (as its code, mapped to a coloured name), the advised size, the TTFT
    effect now and, where the sidecar predicts one, the TTFT change and its basis."""
    d = dashboards.fleet(CFG)
    (table,) = [p for p in d["panels"] if p["title"] == "Engines at a glance"]
    headers = {
        o["matcher"]["options"].removeprefix("Value #"): next(
            q["value"] for q in o["properties"] if q["id"] == "displayName"
        )
        for o in table["fieldConfig"]["overrides"]
    }
    ref = {header: r for r, header in headers.items()}

    def row(header: str) -> list[float]:
        got = live.results[(prom, d["title"], table["title"], ref[header])]
        return [float(s["value"][1]) for s in _by_instance(got, live.flat)]

    assert row("Action") == [ACTION_CODES["grow"]]
    (size,) = _sidecar_value(live, "kvoffload_recommended_size_bytes")
    assert row("Advised --kv-offloading-size") == [float(size["value"][1])]
    effect = _sidecar_value(live, "kvoffload_offload_ttft_effect_seconds", bound="estimate")
    assert row("TTFT effect of the tier now") == [float(s["value"][1]) for s in effect]
    change = _sidecar_value(live, "kvoffload_recommended_ttft_change_seconds", bound="estimate")
    assert effect and change, "the replay's sidecar predicts no TTFT change: nothing compared"
    assert row("TTFT change if applied") == [float(s["value"][1]) for s in change]
    assert row("Basis") == [BASIS_CODES[s["metric"]["basis"]] for s in change]
    # Every column has the row of the H200 engine, the sidecar's and the rules' alike.
    assert all(len(row(h)) == 1 for h in ref if h not in ("TTFT change if applied", "Basis"))
    mapped = {m["options"][str(ACTION_CODES["grow"])]["text"] for m in ACTION_MAPPINGS}
    assert mapped == {"grow"}


def test_the_recommendation_stat_shows_the_action_as_its_code(live: Live) -> None:
    got = live.results[("rules", "kvoffload / Overview", "Recommendation", "A")]
    assert [float(s["value"][1]) for s in _by_instance(got, live.flat)] == [ACTION_CODES["grow"]]


@pytest.mark.parametrize("key", POOLED_KEYS)
def test_pooled_stats_are_sums_over_sums(live: Live, key: str) -> None:
    """The overview's stats pool the selected engines' rates (the H200 replay, its escaped
    twin, the simulator and the replica): on one engine the pooled figure is its rule's; on
    all, a sum over sums, which differs from the mean of their figures."""
    r = rendering_for(key)
    by_instance = {
        (x["metric"]["instance"], x["metric"]["model_name"]): float(x["value"][1])
        for x in live.records[r.record(CFG, r.windows[0] if r.windows else None)]
    }
    one, every = live.pooled[key]
    assert len(one) == 1 and _close(float(one[0]["value"][1]), by_instance[(live.flat, MODEL)])
    (pooled,) = [float(x["value"][1]) for x in every]
    assert min(by_instance.values()) - 1e-9 <= pooled <= max(by_instance.values()) + 1e-9
    if len(set(by_instance.values())) > 1:
        assert not _close(pooled, sum(by_instance.values()) / len(by_instance), 1e-6)


def test_the_advice_annotation_queries_run(live: Live) -> None:
    """The "Advice changes" annotation is valid PromQL on both Prometheus (its marks are
    tested on a change of advice in test_dashboards' promtool case)."""
    assert {(p, n) for p, _d, n in live.annotations} == {
        ("rules", "Advice changes"),
        ("bare", "Advice changes"),
    }
