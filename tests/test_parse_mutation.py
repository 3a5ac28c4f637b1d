"""Mutation test over the real vLLM bodies (issue #12 item 7): a body with bytes flipped,
inserted, deleted, lines doubled or swapped, cut anywhere, never crashes the parser. It parses,
or it raises the parser's one documented error, ParseError (a one-line message); and whenever
the full parse reads it, the sidecar's filtered parse reads it too and keeps exactly the wanted
samples the full parse keeps. The recording reader (OpenMetrics, the same line parser) is held
to the same: it yields scrapes or raises ParseError."""

from __future__ import annotations

import math
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import Limits, ParseError, iter_openmetrics, parse_text

from helpers import H200, SAMPLE, recording_text

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# What a hostile or broken target inserts: the text format's own punctuation, whitespace of
# every kind, numbers Python reads but Prometheus does not, bytes that are not UTF-8, a NUL.
TOKENS = [
    b" ",
    b"\t",
    b"\n",
    b"\r",
    b"\r\n",
    b"{",
    b"}",
    b'"',
    b"\\",
    b",",
    b"=",
    b"#",
    b"# TYPE ",
    b"# TYPE x counter\n",
    b"# HELP ",
    b"\n\t# TYPE vllm:prefix_cache_hits counter\n",
    b"vllm:prefix_cache_hits_total 1\n",
    b'vllm:kv_cache_usage_perc{engine="0"}\t1\t2\n',
    b"NaN",
    b"-Inf",
    b"1e400",
    b"1_000",
    b"0x1p3",
    b"\xc3",
    b"\xff",
    b"\x00",
    "é".encode(),
    "\u2028".encode(),
    b"\x0b",
]


@cache
def _bodies() -> tuple[bytes, ...]:
    picks = ["batch0-0-ready.prom", "batch1-2-A-hit.settled.prom", "batch1-4-C.prom"]
    return (SAMPLE.read_bytes(), *((H200 / "8b-offload" / name).read_bytes() for name in picks))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    body = bytearray(draw(st.sampled_from(_bodies())))
    for _ in range(draw(st.integers(1, 6))):
        size = len(body)
        at = draw(st.integers(0, size))
        op = draw(st.integers(0, 6))
        if op == 0:  # insert a token
            body[at:at] = draw(st.sampled_from(TOKENS))
        elif op == 1:  # overwrite bytes with random ones
            body[at : at + 4] = draw(st.binary(min_size=1, max_size=4))
        elif op == 2:  # delete a range
            del body[at : at + draw(st.integers(1, 200))]
        elif op == 3:  # cut the body short
            del body[at:]
        elif op == 4:  # flip one bit
            if at < size:
                body[at] ^= 1 << draw(st.integers(0, 7))
        else:  # a line doubled (op 5) or moved (op 6)
            lines = bytes(body).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            line = lines[i] if op == 5 else lines.pop(i)
            lines.insert(min(j, len(lines)), line)
            body = bytearray(b"\n".join(lines))
    return bytes(body)


def _parse(body: bytes, *args: object) -> object:
    """The exposition, or the ParseError: nothing else may come out."""
    try:
        return parse_text(body, *args)  # type: ignore[arg-type]
    except ParseError as exc:
        assert "\n" not in str(exc), str(exc)
        return exc


def _nan_safe(samples: list) -> list:
    return [(n, lb, "NaN" if math.isnan(v) else v, ts) for n, lb, v, ts in samples]


@SETTINGS
@given(mutated())
def test_mutated_bodies_parse_or_raise_parse_error(body):
    full = _parse(body)
    filtered = _parse(body, wanted, WANTED_FAMILIES)
    limited = _parse(body, wanted, WANTED_FAMILIES, Limits(samples=100, label_value_bytes=64))
    if isinstance(full, ParseError):
        return
    assert not isinstance(filtered, ParseError), filtered
    assert _nan_safe(filtered.samples) == _nan_safe([s for s in full.samples if wanted(s[0])])
    assert filtered.families == full.families
    if not isinstance(limited, ParseError):
        assert limited.samples == filtered.samples


@cache
def _recording() -> str:
    bodies = [body.decode() for body in _bodies()[1:]]
    return recording_text([(1_700_000_000.0 + 15 * i, body) for i, body in enumerate(bodies)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_recordings_yield_scrapes_or_raise_parse_error(data):
    text = _recording()
    at = data.draw(st.integers(0, len(text)))
    insert = data.draw(st.sampled_from(TOKENS)).decode("utf-8", "replace")
    cut = data.draw(st.integers(0, 300))
    mutated_text = text[:at] + insert + text[at + cut :]
    for unordered in (False, True):
        try:
            for _ in iter_openmetrics([mutated_text], wanted, WANTED_FAMILIES, unordered):
                pass
        except ParseError as exc:
            assert "\n" not in str(exc), str(exc)
