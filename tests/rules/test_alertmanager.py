"""An alert from the generated rules travels Prometheus → Alertmanager → webhook, for real.

A fake vLLM serves a real H200 body (offloading on, before any reload) whose store counters
keep growing: 100 MB/s stored, nothing loaded back. The rules are generated with 10 s windows
and 1 s `for:` (the generator's config, as a user would shorten them), so
KVOffloadLowPrefixReuse fires within seconds; Alertmanager routes it to a webhook this test
runs, which must receive exactly that alert with its labels and annotations.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kvoffload.links import doc
from kvoffload.mixin import rules
from kvoffload.mixin.alerts import ALERT_NAMES
from kvoffload.mixin.config import MixinConfig

from helpers import H200
from promtool_cases import render
from rules_procs import AMTOOL, alertmanager, body_app, need, prometheus, serve

CFG = MixinConfig(rate_window="10s", slow_window="10s", alert_for=dict.fromkeys(ALERT_NAMES, "1s"))
MODEL = "qwen3-8b-dummy"
STORE_BYTES_PER_SECOND = 100e6
BASE = (H200 / "8b-offload" / "batch1-4-C.settled.prom").read_text()
_STORE_LINES = re.compile(
    r"^(vllm:kv_offload_(?:store_(bytes|time)_total|total_(bytes|time)_total)\{[^}]*?"
    r'(?:transfer_type="GPU_to_CPU"[^}]*)?\}) (\S+)$',
    re.M,
)


def storing_without_reuse(t0: float) -> str:
    """The body with store bytes/time advanced by what 100 MB/s adds since t0 (at 32 GB/s)."""
    grown = STORE_BYTES_PER_SECOND * (time.monotonic() - t0)

    def bump(m: re.Match[str]) -> str:
        name = m.group(1)
        if "total_" in name and "GPU_to_CPU" not in name:
            return m.group(0)  # the deprecated load mirror stays where it is
        extra = grown if ("bytes" in name) else grown / 32e9
        return f"{name} {float(m.group(4)) + extra!r}"

    return _STORE_LINES.sub(bump, BASE)


def test_store_lines_are_found() -> None:
    # Two flat (bytes, time) and two deprecated GPU_to_CPU lines grow; CPU_to_GPU stays.
    body = storing_without_reuse(time.monotonic() - 10)
    changed = [a for a, b in zip(BASE.splitlines(), body.splitlines(), strict=True) if a != b]
    assert len(changed) == 4
    assert all("GPU_to_CPU" in line or "_store_" in line for line in changed)


async def _run(workdir: Path) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    async def webhook(request: web.Request) -> web.Response:
        payload = await request.json()
        received.append(payload)
        if any(
            a["labels"].get("alertname") == "KVOffloadLowPrefixReuse" for a in payload["alerts"]
        ):
            arrived.set()
        return web.Response(text="ok")

    hook = web.Application()
    hook.router.add_post("/alerts", webhook)
    t0 = time.monotonic()
    async with (
        serve(hook) as hook_port,
        serve(body_app(lambda: storing_without_reuse(t0))) as vllm_port,
    ):
        am_config = {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "instance"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "webhook",
                    "webhook_configs": [
                        {"url": f"http://127.0.0.1:{hook_port}/alerts", "send_resolved": False}
                    ],
                }
            ],
        }
        async with alertmanager(workdir / "am", am_config) as am_url:
            need(AMTOOL)
            checked = subprocess.run(
                [AMTOOL, "check-config", str(workdir / "am" / "alertmanager.yml")],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
            config = {
                "global": {
                    "scrape_interval": "500ms",
                    "scrape_timeout": "400ms",
                    "evaluation_interval": "500ms",
                },
                "alerting": {
                    "alertmanagers": [
                        {"static_configs": [{"targets": [am_url.removeprefix("http://")]}]}
                    ]
                },
                "scrape_configs": [
                    {
                        "job_name": "vllm",
                        "static_configs": [{"targets": [f"127.0.0.1:{vllm_port}"]}],
                    }
                ],
            }
            files = rules.render(CFG)
            rule_files = {n: files[n] for n in (rules.RULES_FILE, rules.ALERTS_FILE)}
            async with prometheus(workdir / "prom", config, rule_files):
                await asyncio.wait_for(arrived.wait(), timeout=45)
    return received


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return asyncio.run(_run(tmp_path_factory.mktemp("alertmanager")))


def test_webhook_receives_the_alert_with_labels_and_annotations(
    received: list[dict[str, Any]],
) -> None:
    alerts = [
        a
        for p in received
        for a in p["alerts"]
        if a["labels"]["alertname"] == "KVOffloadLowPrefixReuse"
    ]
    assert alerts, received
    alert = alerts[0]
    assert alert["status"] == "firing"
    labels = alert["labels"]
    assert labels["severity"] == "warning"
    assert labels["job"] == "vllm" and labels["model_name"] == MODEL
    assert re.fullmatch(r"127\.0\.0\.1:\d+", labels["instance"])
    rule = next(r for r in rules.alerting_rules(CFG) if r["alert"] == "KVOffloadLowPrefixReuse")
    notes = rule["annotations"]
    assert isinstance(notes, dict)
    assert alert["annotations"] == {
        "summary": notes["summary"],
        "description": render(notes["description"], labels, "0%"),
        "runbook_url": doc("runbooks.md", "kvoffloadlowprefixreuse"),
    }
    assert received[0]["receiver"] == "webhook"


def test_nothing_else_fires_on_a_healthy_scrape(received: list[dict[str, Any]]) -> None:
    names = {a["labels"]["alertname"] for p in received for a in p["alerts"]}
    assert names == {"KVOffloadLowPrefixReuse"}
