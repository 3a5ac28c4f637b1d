"""`kvoffload generate` refuses bad selectors with one line and exit 2, and checks every
expression it writes (promql-parser, and `promtool check rules` where promtool is) before it
writes anything."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvoffload.errors import InputError
from kvoffload.mixin import renderings, rules
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.generate import generate, generate_checked, render_all
from kvoffload.mixin.validate import expressions, validate

from rules_procs import PROMTOOL, need

KVO = [sys.executable, "-m", "kvoffload"]


def kvo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, selector, words",
    [
        ("--selector", 'job="vllm', "unterminated quoted string"),
        ("--selector", "job", "expected label matching operator"),
        ("--selector", 'job="a"} or vector(1) or {b="c"', "more than label matchers"),
        ("--selector", 'job="a" or job="b"', "no `or`"),
        ("--selector", '__name__=~"vllm.+"', "metric name"),
        ("--sidecar-selector", 'job=~"kvo', "unterminated quoted string"),
    ],
)
def test_a_bad_selector_is_refused_in_one_line(
    tmp_path: Path, flag: str, selector: str, words: str
) -> None:
    out = tmp_path / "out"
    r = kvo("generate", "--out", str(out), flag, selector)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kvoffload: error: ")
    assert flag in r.stderr and words in r.stderr and "Traceback" not in r.stderr
    assert not out.exists(), "nothing is written"


def test_selectors_are_normalised_and_generate_succeeds(tmp_path: Path) -> None:
    """Braces and a trailing comma are forgiven; what is spliced in is plain matchers."""
    assert MixinConfig(vllm_selector=' {job="a", ns=~"p.*"} ').vllm_selector == (
        'job="a", ns=~"p.*"'
    )
    assert MixinConfig(vllm_selector='job="a",').vllm_selector == 'job="a"'
    assert MixinConfig(vllm_selector="").vllm_selector == ""
    generate(tmp_path, selector='{job="llm",}')
    rules = (tmp_path / "alerts/rules/kvoffload-rules.yaml").read_text()
    assert 'job="llm"}' in rules and ",," not in rules and "{{" not in rules


def test_the_cli_says_what_checked_the_expressions(tmp_path: Path) -> None:
    need(PROMTOOL)
    r = kvo("generate", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    m = re.search(
        r"validated (\d+) expressions with promql-parser; 3 rule files by (.+) check", r.stderr
    )
    assert m and int(m.group(1)) > 200, r.stderr
    assert len(r.stdout.splitlines()) == len(render_all())


def test_every_written_expression_is_parsed() -> None:
    """Rule exprs, panel queries (collapsed rows' too) and label_values() selectors."""
    files = render_all()
    found = list(expressions(files))
    where = "\n".join(w for w, _e in found)
    rules = yaml.safe_load(files["alerts/rules/kvoffload-rules.yaml"])["groups"][0]["rules"]
    assert all(f"alerts/rules/kvoffload-rules.yaml: {r['record']}" in where for r in rules)
    assert "variable 'instance'" in where and "variable 'engine'" in where
    overview = json.loads(files["dashboards/provisioning/kvoffload-overview.json"])
    collapsed = [c for p in overview["panels"] if p.get("collapsed") for c in p["panels"]]
    assert collapsed and all(f"panel {c['title']!r}" in where for c in collapsed)
    assert not any("$__rate_interval" in e for _w, e in found)
    checked = validate(files, None)
    assert checked.expressions == len(found) and checked.promtool is None


def test_a_bad_rule_expression_stops_generate_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = renderings.rendering_for("reuse_ratio")
    idx = renderings.RENDERINGS.index(bad)
    broken = renderings.Rendering(bad.keys, bad.metric, bad.op, bad.windows, lambda c, w: "sum(x")
    patched = (*renderings.RENDERINGS[:idx], broken, *renderings.RENDERINGS[idx + 1 :])
    monkeypatch.setattr(rules, "RENDERINGS", patched)
    with pytest.raises(
        InputError,
        match=r"promql-parser: alerts/rules/kvoffload-rules.yaml: model_name:vllm_kv_off",
    ):
        generate(tmp_path, promtool=None)
    assert not any(tmp_path.iterdir())


def test_a_bad_dashboard_query_or_variable_is_refused() -> None:
    panel = {"title": "p", "targets": [{"refId": "A", "expr": "rate(x[$__rate_interval])"}]}
    variable = {"name": "v", "type": "query", "definition": 'label_values(up{job=~"$job"}, v)'}
    good = {"panels": [{"type": "row", "panels": [panel]}], "templating": {"list": [variable]}}
    validate({"d.json": json.dumps(good)}, None)
    bad_panel = json.loads(json.dumps(good))
    bad_panel["panels"][0]["panels"][0]["targets"][0]["expr"] = "rate(x[$__rate_interval]"
    with pytest.raises(InputError, match=r"d.json: panel 'p' A"):
        validate({"d.json": json.dumps(bad_panel)}, None)
    bad_var = json.loads(json.dumps(good))
    bad_var["templating"]["list"][0]["definition"] = 'label_values(up{job="x}, v)'
    with pytest.raises(InputError, match=r"d.json: variable 'v'"):
        validate({"d.json": json.dumps(bad_var)}, None)


def test_promtool_checks_the_rule_files(tmp_path: Path) -> None:
    """The real promtool passes the generated rules (all three files); a promtool that fails
    stops generate with its first complaint, the temporary path replaced by the file's."""
    need(PROMTOOL)
    _paths, checked = generate_checked(tmp_path / "real", promtool=PROMTOOL)
    assert checked.rule_files == 3 and checked.promtool == PROMTOOL
    fake = tmp_path / "promtool"
    fake.write_text(
        "#!/bin/sh\nshift 2\n"
        'echo "Checking $1" >&2\necho "  FAILED:" >&2\necho "$1: 3:1: bad rule" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    out = tmp_path / "refused"
    with pytest.raises(
        InputError, match=r"promtool check rules: alerts/rules/kvoffload-\S+: 3:1: bad"
    ):
        generate(out, promtool=str(fake))
    assert not out.exists()


def test_promtool_speaks_for_the_users_prometheus(tmp_path: Path) -> None:
    """Quoted label names are Prometheus 3 syntax: promql-parser takes them, a Prometheus 2
    promtool does not, and generate believes promtool."""
    need(PROMTOOL)
    version = subprocess.run([PROMTOOL, "--version"], capture_output=True, text=True)
    if not re.search(r"version 2\.", version.stdout + version.stderr):
        pytest.skip("promtool is not Prometheus 2's")
    generate(tmp_path / "without", selector='"job"="vllm"', promtool=None)
    with pytest.raises(InputError, match="refused by promtool check rules"):
        generate(tmp_path / "with", selector='"job"="vllm"', promtool=PROMTOOL)
