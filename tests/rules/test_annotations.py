"""The dashboards' "Advice changes" annotation, evaluated by promtool on a change of advice."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.mixin import dashboards
from kvoffload.mixin.config import MixinConfig

from rules_procs import PROMTOOL, need

TARGET = "vllm-0:8000"
MODEL = "qwen3-8b"
LABELS = f'job="kvoffload", model_name="{MODEL}", target="{TARGET}"'


def _annotation(d: dict[str, Any]) -> dict[str, Any]:
    (a,) = [a for a in d["annotations"]["list"] if a.get("name") == "Advice changes"]
    return dict(a)


def _case(expr: str) -> dict[str, object]:
    """Keep until minute 10, grow from minute 11; the sidecar's first advice at minute 0."""
    series = [
        {"series": f'kvoffload_recommendation{{{LABELS}, action="keep"}}', "values": "1x10 0x10"},
        {"series": f'kvoffload_recommendation{{{LABELS}, action="grow"}}', "values": "0x10 1x10"},
    ]

    def marks(minute: int, action: str | None) -> dict[str, object]:
        samples = (
            [{"labels": f'kvoffload_recommendation{{{LABELS}, action="{action}"}}', "value": 1}]
            if action
            else []
        )
        return {"expr": expr, "eval_time": f"{minute}m", "exp_samples": samples}

    tests = [marks(0, "keep"), marks(5, None), marks(11, "grow"), marks(12, None)]
    return {"interval": "1m", "input_series": series, "promql_expr_test": tests}


@pytest.mark.parametrize("build", [dashboards.overview, dashboards.fleet])
def test_the_advice_annotation_marks_each_change_once(
    build: Callable[[MixinConfig], dict[str, Any]], tmp_path: Path
) -> None:
    """At a step where the advice moved from keep to grow the annotation has one sample, the
    new action (its title and tag); at steps where it stood, none."""
    need(PROMTOOL)
    a = _annotation(build(MixinConfig()))
    assert a["step"] == "1m" and a["tagKeys"] == "action" and "{{action}}" in a["titleFormat"]
    expr = a["expr"].replace("$instance", ".+").replace("$model_name", ".+")
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [_case(expr)]}
    path = tmp_path / "annotation.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", path.name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
