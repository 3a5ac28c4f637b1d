"""The text-format parser against prometheus_client's, and the sidecar's filtered parse against
the full one, on generated expositions (hypothesis): valid text format spaced every way the
format allows (blanks and tabs between tokens, leading and trailing, blank lines), comments,
HELP and TYPE lines, escapes in label values, timestamps, histograms, summaries, and samples
that come without their family's TYPE line after a family nobody asked for (issue #12).

Where prometheus_client and Prometheus read valid input differently, kvoffload follows
Prometheus (model/textparse/promlex.l): a counter's samples keep the name they were written
with (prometheus_client appends `_total` to a counter family's samples written without it).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import canonical_name, parse_text

# Bounded: each property runs in a few seconds on a busy two-core machine (make test).
SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Family names: ones the sidecar reads, ones it skips (two begin a wanted family's name:
# `vllm:num_requests_waiting` / `..._by_reason`), colon-escaped spellings, and random ones.
KNOWN = [
    "vllm:prefix_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:kv_offload_load_bytes",
    "vllm:kv_offload_load_size",
    "vllm:num_requests_waiting_by_reason",
    "vllm:time_to_first_token_seconds",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_cached",
    "vllm:request_prompt_tokens",
    "vllm:generation_tokens",
    "vllm_prefix_cache_hits",
    "vllm_iteration_tokens",
    "process_cpu_seconds",
]
NAMES = st.one_of(
    st.sampled_from(KNOWN),
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
)
TYPES = ["counter", "gauge", "histogram", "summary", "untyped"]
SUFFIXES = {
    "counter": ["_total", "_created"],
    "gauge": [""],
    "histogram": ["_bucket", "_bucket", "_count", "_sum", "_created"],
    "summary": ["", "_count", "_sum", "_created"],
    "untyped": [""],
}
LABEL_NAMES = ["model_name", "engine", "le", "quantile", "reason", "a", "B_2", "_x"]
# Label values: quotes, backslashes and newlines (escaped when written), and the characters a
# tokeniser could trip on: blanks, tabs, braces, commas, equals signs, `#`.
VALUE_CHARS = st.sampled_from([*'ab1 \t{}",=#\\\n', "é", "·"])
BLANKS = st.sampled_from([" ", " ", " ", "\t", "  ", " \t", "\t\t"])
OPTIONAL_BLANKS = st.sampled_from(["", "", "", " ", "\t", " \t "])
NUMBERS = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["+Inf", "-Inf", "NaN", "Inf", "nan", "1e3", "-2.5E-3", ".5", "+7", "0"]),
)
TIMESTAMPS = st.integers(0, 2**53).map(str)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def sample_lines(draw: st.DrawFn, name: str) -> str:
    line = draw(OPTIONAL_BLANKS) + name
    names = draw(st.lists(st.sampled_from(LABEL_NAMES), max_size=3, unique=True))
    if names or draw(st.booleans()):
        pairs = []
        for label in names:
            value = _escape("".join(draw(st.lists(VALUE_CHARS, max_size=6))))
            pairs.append(
                draw(OPTIONAL_BLANKS)
                + label
                + draw(OPTIONAL_BLANKS)
                + "="
                + draw(OPTIONAL_BLANKS)
                + f'"{value}"'
                + draw(OPTIONAL_BLANKS)
            )
        trailing = "," + draw(OPTIONAL_BLANKS) if pairs and draw(st.booleans()) else ""
        line += draw(OPTIONAL_BLANKS) + "{" + ",".join(pairs) + trailing + "}"
        line += draw(OPTIONAL_BLANKS)
    else:
        line += draw(BLANKS)
    line += draw(NUMBERS)
    if draw(st.booleans()):
        line += draw(BLANKS) + draw(TIMESTAMPS)
    return line + draw(OPTIONAL_BLANKS)


@st.composite
def expositions(draw: st.DrawFn) -> tuple[str, set[str]]:
    """(text, the canonical names of counter families whose TYPE line lacks `_total`)."""
    bases = draw(st.lists(NAMES, min_size=1, max_size=6, unique_by=canonical_name))
    others = draw(st.lists(NAMES, max_size=3))  # samples of no declared family
    lines: list[str] = []
    bare_counters: set[str] = set()
    for base in bases:
        mtype = draw(st.sampled_from(TYPES))
        declared = base
        if mtype == "counter":
            if draw(st.booleans()):
                declared = base + "_total"
            else:
                bare_counters.add(canonical_name(base))
        if draw(st.booleans()):
            help_text = _escape("".join(draw(st.lists(VALUE_CHARS, max_size=8))))
            lines.append(f"# HELP {declared} {help_text}")
        if draw(st.integers(0, 4)):
            lines.append(
                draw(OPTIONAL_BLANKS)
                + "#"
                + draw(BLANKS)
                + "TYPE"
                + draw(BLANKS)
                + declared
                + draw(BLANKS)
                + mtype
                + draw(OPTIONAL_BLANKS)
            )
        own = [declared] if mtype in ("counter", "gauge", "untyped") else []
        own += [base + suffix for suffix in SUFFIXES[mtype] if suffix]
        for _ in range(draw(st.integers(0, 4))):
            if others and draw(st.integers(0, 5)) == 0:
                name = draw(st.sampled_from(others))  # a sample without its own TYPE line
            else:
                name = draw(st.sampled_from(own))
            lines.append(draw(sample_lines(name)))
        if draw(st.integers(0, 4)) == 0:
            lines.append(draw(st.sampled_from(["", " ", "\t", "# a comment", "#no blank"])))
    return "\n".join(lines) + "\n", bare_counters


def _reference(text: str, bare_counters: set[str]) -> tuple[list, dict[str, str]]:
    """prometheus_client's reading, flat, in kvoffload's terms: canonical names, float values,
    and a counter's samples under the name they were written with (as Prometheus keeps it)."""
    samples = []
    families = {}
    for family in text_string_to_metric_families(text):
        name = canonical_name(family.name)
        if family.type != "unknown":
            families[name] = family.type
        for sample in family.samples:
            sample_name = canonical_name(sample.name)
            if family.type == "counter" and name in bare_counters:
                sample_name = sample_name.removesuffix("_total")
            samples.append((sample_name, sample.labels, float(sample.value), sample.timestamp))
    return samples, families


def _same(ours: list, theirs: list) -> bool:
    if len(ours) != len(theirs):
        return False
    for (n1, l1, v1, t1), (n2, l2, v2, t2) in zip(ours, theirs, strict=True):
        if (n1, l1, t1) != (n2, l2, t2):
            return False
        if not (v1 == v2 or (math.isnan(v1) and math.isnan(v2))):
            return False
    return True


@pytest.mark.slow
@SETTINGS
@given(expositions())
def test_full_parse_equals_prometheus_client(doc):
    text, bare_counters = doc
    theirs, their_families = _reference(text, bare_counters)
    expo = parse_text(text)
    assert _same(expo.samples, theirs), (expo.samples, theirs)
    ours = {name: mtype for name, mtype in expo.families.items() if mtype != "untyped"}
    assert ours == their_families


@pytest.mark.slow
@SETTINGS
@given(expositions())
def test_filtered_parse_keeps_what_the_full_parse_keeps(doc):
    text, _ = doc
    full = parse_text(text)
    filtered = parse_text(text, wanted, WANTED_FAMILIES)
    assert _same(filtered.samples, [s for s in full.samples if wanted(s[0])])
    assert filtered.families == full.families


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_a_wanted_sample_after_a_skipped_family_is_kept(data):
    """Issue #12's case, made likely: a wanted sample with no TYPE line of its own right after
    (or inside) the samples of a family nobody asked for, with every skip the parser has."""
    skipped = data.draw(
        st.sampled_from(["vllm:request_prompt_tokens", "vllm:num_requests_waiting", "foo"])
    )
    mtype = data.draw(st.sampled_from(["histogram", "gauge", "counter"]))
    own = [skipped + s for s in SUFFIXES[mtype] if s] or [skipped]
    kept = data.draw(st.sampled_from(["vllm:prefix_cache_hits_total", "vllm:kv_cache_usage_perc"]))
    lines = [f"# HELP {skipped} h", f"# TYPE {skipped} {mtype}"]
    lines += [data.draw(sample_lines(data.draw(st.sampled_from(own)))) for _ in range(3)]
    at = data.draw(st.integers(2, len(lines)))
    lines.insert(at, data.draw(sample_lines(kept)))
    text = "\n".join(lines) + "\n# HELP x y\n"
    full = parse_text(text)
    filtered = parse_text(text, wanted, WANTED_FAMILIES)
    assert [s[0] for s in filtered.samples] == [kept]
    assert _same(filtered.samples, [s for s in full.samples if wanted(s[0])])


def test_whitespace_the_format_allows_is_read_as_prometheus_reads_it():
    # The four cases issue #12 found, and the ways of spacing a TYPE line.
    ts = 1_700_000_000.0
    body = (
        "a\t100\n"
        "b 100\t1700000000000\n"
        "c\t100 1700000000000\n"
        'd {x="1"} 1\n'
        'e\t{x="1"}\t1\n'
        "  f 1 \n"
        "\t\n"
        "  # TYPE g_total counter\n"
        "#\tTYPE\th  gauge \n"
        'g_total{ x = "1" , } 1\n'
        "h{ } 2\n"
    )
    expo = parse_text(body)
    assert expo.samples == [
        ("a", {}, 100.0, None),
        ("b", {}, 100.0, ts),
        ("c", {}, 100.0, ts),
        ("d", {"x": "1"}, 1.0, None),
        ("e", {"x": "1"}, 1.0, None),
        ("f", {}, 1.0, None),
        ("g_total", {"x": "1"}, 1.0, None),
        ("h", {}, 2.0, None),
    ]
    assert expo.families == {"g": "counter", "h": "gauge"}
    kept = parse_text(body, lambda name: name in ("c", "e"), {"c", "e"})
    assert [s[0] for s in kept.samples] == ["c", "e"]


@st.composite
def recordings(draw: st.DrawFn) -> str:
    """A recording (OpenMetrics, scrape by scrape) whose scrapes mix families the sidecar reads,
    families it skips, and samples with no TYPE line of their own after a skipped family."""
    families = draw(st.lists(st.sampled_from(KNOWN), min_size=1, max_size=5, unique=True))
    lines = []
    for scrape in range(draw(st.integers(1, 3))):
        ts = f"{1_700_000_000 + 15 * scrape}.5"
        for family in families:
            mtype = draw(st.sampled_from(["counter", "gauge", "histogram"]))
            lines.append(f"# TYPE {family} {mtype}")
            own = [family + s for s in SUFFIXES[mtype] if s] or [family]
            for _ in range(draw(st.integers(0, 3))):
                name = draw(st.sampled_from([*own, *own, "vllm:prefix_cache_hits_total"]))
                labels = draw(st.sampled_from(["", '{engine="0"}', '{le="+Inf",engine="1"}']))
                lines.append(f"{name}{labels} {draw(st.integers(0, 99))} {ts}")
        lines += ["# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc 0.5 {ts}"]
    return "\n".join(lines) + "\n# EOF\n"


@SETTINGS
@given(recordings(), st.integers(8, 400), st.booleans())
def test_filtered_recording_keeps_what_the_full_reading_keeps(text, chunk_size, unordered):
    # Whatever the chunk boundaries (inside a skipped family's samples too), in both layouts.
    import io

    from kvoffload.ingest.parse import iter_openmetrics, read_chunks

    def read(wanted_fn, families):
        chunks = read_chunks(io.StringIO(text), chunk_size)
        return [
            ([s for s in e.samples if wanted(s[0])], e.timestamp)
            for e in iter_openmetrics(chunks, wanted_fn, families, unordered)
        ]

    full = read(None, None)
    filtered = read(wanted, WANTED_FAMILIES)
    assert [f for f in filtered if f[0]] == [f for f in full if f[0]]
