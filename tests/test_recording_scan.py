"""The compiled scan (recording/_scan.c's `scan_series`) and the strict reader's pure-Python
reading give the same columns: on generated strict files with every oddity the reader must hand
back to its Python path (a line of another family, blanks in label values, time going back or
repeated, a NaN time, values float() refuses or reads its own way), and on the real H200
captures. The build is checked too: where the tests run, the compiled scan must exist (`make
deps` has a C compiler), or half of these would prove nothing."""

from __future__ import annotations

import math
import struct
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.recording import blocks, strict_reader
from kvoffload.recording.blocks import family_spec
from kvoffload.recording.openmetrics import finalize_journal

from helpers import h200_scrapes, recording_text

compiled = blocks.compiled_scan

COUNTER = family_spec(b"vllm:prompt_tokens", b"counter")

_NUMBERS = st.one_of(
    st.floats(allow_nan=False).map(lambda x: repr(x).encode()),
    st.integers(-(10**20), 10**20).map(lambda n: str(n).encode()),
)
_ODD_VALUES = st.sampled_from(
    [b"NaN", b"+Inf", b"-Inf", b"inf", b"1_000", b"1e999", b"-0", b"", b"abc", b"1e", b".",
     b"0x10", b"1.5\t", b"\t2", b"+-1", b"00012", b"1" * 80, b"1.", b".5e-3"]
)  # fmt: skip
_ODDITIES = [None] * 4 + ["foreign", "blank", "back", "nan time", "value", "same time", "more"]


def test_the_compiled_scan_is_built() -> None:
    assert compiled is not None, (
        "recording/_scan.c was not built: is there a C compiler? (make deps)"
    )


@st.composite
def _strict_file(draw: st.DrawFn) -> bytes:
    """A strict recording: each family once, each series' points together — a counter's
    `_total` and `_created` interleaved point by point, as `record` leaves them — with now and
    then one thing the bulk read does not take."""
    out = []
    for raw, mtype in ((b"vllm:prompt_tokens", b"counter"), (b"vllm:num_preemptions", b"counter")):
        out.append(b"# TYPE " + raw + b" " + mtype + b"\n")
        for engine in range(draw(st.integers(1, 3))):
            labels = b'{engine="%d",instance="i:1",model_name="m"}' % engine
            odd = draw(st.sampled_from(_ODDITIES))
            points = draw(st.integers(1, 6))
            odd_at = draw(st.integers(0, points - 1))
            t = 1.8e9
            for k in range(points):
                here = odd if k == odd_at else None
                t += 0.0 if here == "same time" else 15.0
                stamp = b"NaN" if here == "nan time" else repr(t - 60 * (here == "back")).encode()
                value = draw(_ODD_VALUES if here == "value" else _NUMBERS)
                name = b"vllm:other_total" if here == "foreign" else raw + b"_total"
                head = name + (b'{model_name="a b"}' if here == "blank" else labels)
                more = b" 1" if here == "more" else b""
                out.append(head + b" " + value + b" " + stamp + more + b"\n")
                out.append(raw + b"_created" + labels + b" 1.7e9 " + stamp + b"\n")
    return b"".join(out) + b"# EOF\n"


def _columns_read(path: str, compiled_scan: bool) -> object:
    """What the strict reader makes of a file: each series' times and values, and which
    instances declared each family ("declined" when it declines the file)."""
    saved = blocks.COMPILED
    blocks.COMPILED = compiled_scan
    try:
        with blocks.mapped(path) as mm:
            columns, _instances, users = strict_reader._read_columns(mm, None)
    except blocks.Declined:
        return "declined"
    finally:
        blocks.COMPILED = saved
    out = []
    for (inst, index), column in columns.items():
        values = column.values()
        if not isinstance(values, array):
            values = array("d", [values[0]] * len(column.times))
        out.append((inst.shapes.instance, index, column.times.tobytes(), values.tobytes()))
    return sorted(out), {k: None if v is None else sorted(v) for k, v in users.items()}


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(_strict_file())
def test_strict_pieces_read_alike_both_ways(tmp_path_factory: pytest.TempPathFactory, text: bytes):
    path = tmp_path_factory.mktemp("strict") / "rec.om"
    path.write_bytes(text)
    assert _columns_read(str(path), True) == _columns_read(str(path), False)


def test_values_read_as_float_reads_them() -> None:
    """The compiled scan's own number reading agrees with float() where it takes over."""
    assert compiled is not None
    tokens = [b"0", b"-0.0", b"1e308", b"1e309", b"4.9e-324", b"2.5e-324", b"0.1",
              b"123456789012345678901234567890", b"1.7976931348623157e308", b"9007199254740993",
              b"1E5", b"+1.5", b"NaN", b"nan", b"-Infinity"]  # fmt: skip
    data = b"".join(b"vllm:prompt_tokens_total " + t + b" %d\n" % k for k, t in enumerate(tokens))
    runs = compiled(data, 0, len(data), COUNTER.wanted, COUNTER.unwanted)
    assert runs is not None and len(runs) == 1
    head, stamps, numbers, ordered = runs[0]
    assert head == b"vllm:prompt_tokens_total" and ordered
    assert list(array("d", stamps)) == [float(k) for k in range(len(tokens))]
    for token, value in zip(tokens, array("d", numbers), strict=True):
        expected = float(token)
        assert struct.pack("<d", value) == struct.pack("<d", expected) or (
            math.isnan(value) and math.isnan(expected)
        ), token


def test_what_the_bulk_read_does_not_take_is_handed_back() -> None:
    """None (the Python reading takes the piece) for a line of another family, a third blank,
    a value float() refuses and a piece without its final newline."""
    assert compiled is not None
    good = b'vllm:prompt_tokens_total{engine="0"} 1 5\n'
    for odd in (
        b"vllm:other_total 1 5\n",
        b'vllm:prompt_tokens_total{m="a b"} 1 5\n',
        b"vllm:prompt_tokens_total 1 5 6\n",
        b"vllm:prompt_tokens_total abc 5\n",
    ):
        data = good + odd
        assert compiled(data, 0, len(data), COUNTER.wanted, COUNTER.unwanted) is None, odd
    assert compiled(good, 0, len(good) - 1, COUNTER.wanted, COUNTER.unwanted) is None
    assert compiled(good, 0, len(good), COUNTER.wanted, COUNTER.unwanted) is not None


def test_bad_arguments_raise_not_crash() -> None:
    assert compiled is not None
    with pytest.raises(ValueError):
        compiled(b"abc\n", 0, 99, COUNTER.wanted, COUNTER.unwanted)
    with pytest.raises(ValueError):
        compiled(b"abc\n", 3, 1, COUNTER.wanted, COUNTER.unwanted)
    with pytest.raises(TypeError):
        compiled(b"abc\n", 0, 4, ("x",), ())


@pytest.mark.parametrize("name", ["8b-offload", "8b-nooffload"])
def test_the_real_captures_read_alike_and_in_bulk(name: str, tmp_path: Path) -> None:
    """The H200 capture's strict file: the same columns both ways, and a bulk answer for every
    wanted block vLLM writes (no odd lines in them)."""
    assert compiled is not None
    journal = tmp_path / "h200.journal"
    journal.write_text(recording_text(h200_scrapes(name), instance="h200:8000"))
    path = tmp_path / "h200.om"
    finalize_journal(str(journal), str(path))
    assert _columns_read(str(path), True) == _columns_read(str(path), False) != "declined"
    data = path.read_bytes()
    bulk = 0
    pos = 0
    while (pos := data.find(b"# TYPE ", pos)) != -1:
        eol = data.index(b"\n", pos)
        _hash, _type, raw, mtype = data[pos:eol].split(b" ")
        spec = family_spec(raw, mtype)
        end = data.find(b"\n#", eol) + 1
        if spec.wanted and end > eol + 1:  # (a family declared before its first sample)
            assert compiled(data, eol + 1, end, spec.wanted, spec.unwanted) is not None, raw
            bulk += 1
        pos = end
    assert bulk > 10
