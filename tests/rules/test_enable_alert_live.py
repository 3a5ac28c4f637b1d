"""KVOffloadRecommendEnable on the README's enable scenario, in a real Prometheus.

`pressure-without-offloading` (no tier, reuse the GPU cannot keep) is the scenario the advisor
says `enable` for. Its pressure is churn: KV usage averages ~0.1, nothing is preempted or waits
at a scrape's instant, but prefixes are evicted within seconds. The alert's churn term (GPU
turnover under the reuse horizon) needs the GPU's capacity in tokens, a label value of
cache_config_info that PromQL cannot read: the sidecar exports it. So the alert holds with the
sidecar scraped, and on vLLM's series alone it cannot (measured here: it stays quiet).
Prometheus scrapes the simulator (replayed at 10x) and the sidecar every 0.5 s and evaluates
the rules with 30 s windows; the alert's expression (its `for:` aside) is read after a window.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from kvoffload.analysis.analyze import Settings
from kvoffload.mixin import rules
from kvoffload.mixin.config import MixinConfig
from kvoffload.sidecar.http import make_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.thresholds import Thresholds

from rules_procs import PromAPI, body_app, prometheus, serve

CFG = MixinConfig(rate_window="30s", slow_window="30s")
SCENARIO = "pressure-without-offloading"
WARMUP = 300.0  # simulated seconds before the first scrape: caches full, pressure on
SPEED = 10.0  # simulated seconds per real second: 30 s windows hold 5 simulated minutes
RUN = 35.0  # real seconds of scraping: one full window, and the evaluations after it


Query = dict[str, list[dict[str, object]]]


async def _enable_samples(workdir: Path) -> tuple[Query, str]:
    """The alert's expression on Prometheus with the sidecar scraped and on one without."""
    sim = SimServer(scenarios.get(SCENARIO), seed=0)
    sim.advance_to(WARMUP)
    start = time.monotonic()

    def body() -> str:
        sim.advance_to(WARMUP + SPEED * (time.monotonic() - start))
        return sim.render().decode()

    (enable,) = [r for r in rules.alerting_rules(CFG) if r["alert"] == "KVOffloadRecommendEnable"]
    async with serve(body_app(body)) as port:
        vllm = f"127.0.0.1:{port}"
        settings = Settings(thresholds=Thresholds(min_window_seconds=1, min_requests=1))
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://{vllm}/metrics"],
                interval_seconds=0.5,
                window_seconds=30.0,
                timeout_seconds=1.0,
                settings=settings,
            )
        )
        async with serve(make_app(sidecar)) as sidecar_port:
            jobs = {
                "vllm": [vllm],
                "kvoffload": [f"127.0.0.1:{sidecar_port}"],
            }

            def config(names: tuple[str, ...]) -> dict[str, object]:
                return {
                    "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
                    "scrape_configs": [
                        {"job_name": n, "static_configs": [{"targets": jobs[n]}]} for n in names
                    ],
                }

            files = rules.render(CFG)
            rule_files = {n: files[n] for n in (rules.RULES_FILE, rules.ALERTS_FILE)}
            async with (
                prometheus(workdir, config(("vllm", "kvoffload")), rule_files) as url,
                prometheus(workdir / "alone", config(("vllm",)), rule_files) as alone_url,
                aiohttp.ClientSession() as session,
            ):
                api, alone = PromAPI(session, url), PromAPI(session, alone_url)
                await api.wait_for("up == 1", 2)
                await asyncio.sleep(RUN)
                got = {
                    "sidecar": await api.query(str(enable["expr"])),
                    "alone": await alone.query(str(enable["expr"])),
                    "turnover": await api.query(
                        f"model_name:kvoffload_gpu_turnover_seconds:ratio_rate{CFG.rate_window}"
                    ),
                }
                return got, str(enable["annotations"]["description"])  # type: ignore[index]


@pytest.mark.slow
def test_recommend_enable_fires_with_the_sidecar_on_the_enable_scenario(tmp_path: Path) -> None:
    got, description = asyncio.run(_enable_samples(tmp_path))
    assert got["turnover"], "the sidecar's GPU capacity did not reach the rules"
    assert got["sidecar"], "KVOffloadRecommendEnable does not hold with the sidecar scraped"
    assert {s["metric"]["job"] for s in got["sidecar"]} == {"vllm"}  # type: ignore[index]
    # vLLM's series alone carry no churn: the alert stays quiet (see the module docstring).
    assert got["alone"] == []
    # The text names the sidecar's size where it runs, else says how to get one.
    assert "as the kvoffload sidecar advises" in description
    assert "run the kvoffload sidecar next to this engine for the size" in description
