"""Every document says the same thing about every figure: the meanings come from the signal
catalog (generated tables in docs/rules.md and docs/runbooks.md, the dashboards' panel
descriptions, /metrics and docs/metrics.md), and no hand-written page contradicts them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.errors import InputError
from kvoffload.mixin.reference import (
    CITED_BEGIN,
    CITED_END,
    cited_table,
    meanings,
    regenerate,
    rules_table,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_runbooks_figures_table_is_generated_and_current() -> None:
    doc = (ROOT / "docs" / "runbooks.md").read_text()
    assert CITED_BEGIN in doc and doc == regenerate(doc), "regenerate: make generate"
    table = doc.split(CITED_BEGIN, 1)[1].split(CITED_END, 1)[0]
    wasted = "model_name:vllm_kv_offload_wasted_bytes:increase1h"
    (row,) = [line for line in table.splitlines() if f"`{wasted}`" in line]
    assert FIGURES_BY_KEY["wasted_bytes"].help in row


def test_a_runbook_citing_no_such_rule_fails_the_generator() -> None:
    text = f"Check `model_name:vllm_kv_offload_reuse:ratio_rate2h`.\n{CITED_BEGIN}\n{CITED_END}\n"
    with pytest.raises(InputError, match="ratio_rate2h"):
        cited_table(text)


def test_rules_md_gives_each_rule_the_catalogs_meaning() -> None:
    table = rules_table()
    known = meanings()
    rows = [line for line in table.splitlines()[3:-1] if "| (helper) |" not in line]
    assert len(rows) > 20
    for line in rows:
        rule = re.match(r"\| `([^`]+)`", line)
        assert rule, line
        assert f"| {known[rule.group(1)][1].replace('|', chr(92) + '|')} |" in line, line


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_page_calls_stored_minus_loaded_an_upper_bound(path: Path) -> None:
    """stored − loaded ≤ bytes never loaded back (every reloaded byte was loaded at least
    once): a lower bound, as signals.py's help says."""
    assert "lower bound" in FIGURES_BY_KEY["wasted_bytes"].help
    assert not re.search(r"upper[ -]bound", path.read_text(), re.I)


def test_no_reference_to_a_design_document_the_repository_lacks() -> None:
    texts = [*DOCS, *sorted((ROOT / "exporter" / "kvoffload").rglob("*.py"))]
    cited = [
        str(p.relative_to(ROOT)) for p in texts if re.search(r"DESIGN(\.md| §)", p.read_text())
    ]
    assert not (ROOT / "DESIGN.md").exists()
    assert cited == []
