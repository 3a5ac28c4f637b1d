"""One formula per figure: the sidecar's Python and the rules' PromQL both come from
`signals.FIGURES[*].formula` (tests/rules/test_prometheus.py proves the two renderings equal on
a real Prometheus); what PromQL cannot compute is a PythonOnly part with its reason."""

import re
from pathlib import Path

import pytest

from kvoffload.analysis.formula import PythonOnly, Rate, Ratio, share_family
from kvoffload.analysis.signals import FIGURES
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.renderings import NOT_IN_PROMQL, rendering_for

SRC = Path(__file__).resolve().parents[2] / "exporter" / "kvoffload"
CONFIGS = [
    MixinConfig(),
    MixinConfig(
        rate_window="30s",
        slow_window="2h",
        world_size=4,
        vllm_selector='job="vllm", cluster="a"',
        target_labels=("cluster", "instance"),
    ),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f.key)
def test_every_figure_is_one_formula_that_its_rule_renders(fig, cfg):
    if fig.key in NOT_IN_PROMQL:
        assert isinstance(fig.formula, PythonOnly) and fig.formula.why == NOT_IN_PROMQL[fig.key]
        return
    rendering = rendering_for(fig.key)
    for which in rendering.windows or (None,):
        w = rendering.window(cfg, which) if which else ""
        built = rendering.build(cfg, w)
        if len(rendering.keys) == 1:
            assert built == fig.formula.promql(cfg, w)
        else:  # one rule for figures that differ in a label's value only
            shares = [next(f for f in FIGURES if f.key == k).formula for k in rendering.keys]
            assert all(isinstance(s, Ratio) and isinstance(s.num, Rate) for s in shares)
            assert built == share_family(cfg, w, shares, fig.labels[0][0])
            assert dict(fig.labels)["source"] in built


@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f.key)
def test_python_only_parts_say_why(fig):
    for part in fig.formula.python_only():
        assert len(part.why) > 20, (fig.key, part.why)


def test_the_figures_name_no_vllm_series_only_catalog_keys():
    """vLLM's spellings (current, legacy, escaped) live in the metric catalog (catalog.py) and
    formula.py renders them; the figure definitions use catalog keys only."""
    text = (SRC / "analysis" / "signals.py").read_text()
    assert not re.search(r"vllm[:_][a-z]", text)
    assert "transfer_type" not in text and "_total" not in text


def test_world_size_and_target_labels_reach_the_promql():
    cfg = CONFIGS[1]
    load_tps = next(f for f in FIGURES if f.key == "load_tokens_per_second").formula
    text = load_tps.promql(cfg, "30s")
    assert text.split()[-2:] == ["*", "4"] and "sum by (cluster, instance, model_name)" in text
    assert 'cluster="a"' in text
