"""The compiled block scan (recording/_scan.c) and its pure-Python twin (fastjournal._scan_block)
give the same answer on every block: generated family blocks with every oddity the reader must
hand back to its line-by-line path (a line of another family, blanks in label values, two
timestamps, values float() refuses or reads its own way, no final newline), and every wanted
block of the real H200 captures. The build is checked too: where the tests run, the compiled
scan must exist (`make deps` has a C compiler), or half of these would prove nothing."""

from __future__ import annotations

import math
import struct
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.recording import journal_reader as fastjournal
from kvoffload.recording import strict_reader as faststrict
from kvoffload.recording.journal_reader import _family, _scan_block

from helpers import h200_scrapes, recording_text

compiled = fastjournal._compiled_scan_block

HISTOGRAM = _family(b"vllm:time_to_first_token_seconds", b"histogram")
COUNTER = _family(b"vllm:prompt_tokens", b"counter")

_NUMBERS = st.one_of(
    st.floats(allow_nan=False).map(lambda x: repr(x).encode()),
    st.integers(-(10**20), 10**20).map(lambda n: str(n).encode()),
)
_ODD_VALUES = st.sampled_from(
    [b"NaN", b"+Inf", b"-Inf", b"inf", b"1_000", b"1e999", b"-0", b"", b"abc", b"1e", b".",
     b"0x10", b"1.5\t", b"\t2", b"+-1", b"00012", b"1" * 80, b"1.", b".5e-3"]
)  # fmt: skip
_LABELS = st.sampled_from([b"", b'{engine="0",model_name="m"}', b'{le="0.5",engine="1"}', b"{}"])
# One thing a block may have that the bulk read does not take (or, for odd values, that the
# compiled scan reads through float() itself); most blocks have none.
_ODDITIES = [None] * 5 + ["foreign", "blank", "stamp", "value", "no newline", "no stamp", "more"]


@st.composite
def _block(draw: st.DrawFn) -> tuple[fastjournal._Family, bytes, int, int]:
    spec = draw(st.sampled_from([HISTOGRAM, COUNTER]))
    names = [p[:-1] for p in spec.wanted + spec.unwanted]
    stamp = draw(st.sampled_from([b"1800000000.0", b"1.8e9", b"17"]))
    count = draw(st.integers(0, 12))
    odd, odd_line = draw(st.sampled_from(_ODDITIES)), draw(st.integers(0, max(count - 1, 0)))
    lines = []
    for i in range(count):
        here = odd if i == odd_line else None
        name = b"vllm:other" if here == "foreign" else draw(st.sampled_from(names))
        labels = b'{model_name="a b"}' if here == "blank" else draw(_LABELS)
        value = draw(_ODD_VALUES if here == "value" else _NUMBERS)
        line = name + labels + b" " + value
        if here != "no stamp":
            line += b" " + (b"1800000015.0" if here == "stamp" else stamp)
        if here == "more":
            line += b" 1"
        lines.append(line)
    text = b"\n".join(lines) + (b"" if odd == "no newline" or not lines else b"\n")
    before = draw(st.sampled_from([b"", b"# TYPE x counter\nx 1 2\n"]))
    after = b"# EOF\n"
    return spec, before + text + after, len(before), len(before) + len(text)


def _same(a: object, b: object) -> bool:
    """Equal, floats to the bit (NaN and -0.0 included)."""
    if a is None or b is None:
        return a is b
    assert isinstance(a, tuple) and isinstance(b, tuple)
    pack = lambda xs: b"".join(struct.pack("<d", x) for x in xs)  # noqa: E731
    return pack(a[0]) == pack(b[0]) and a[1:] == b[1:]


def test_the_compiled_scan_is_built() -> None:
    assert compiled is not None, (
        "recording/_scan.c was not built: is there a C compiler? (make deps)"
    )


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_block())
def test_compiled_and_pure_scans_agree(case: tuple[fastjournal._Family, bytes, int, int]) -> None:
    assert compiled is not None
    spec, data, start, end = case
    pure = _scan_block(spec, data, start, end, None)
    fast = compiled(data, start, end, spec.wanted, spec.unwanted, None)
    assert _same(pure, fast), (data, pure, fast)
    if pure is not None:
        assert all(isinstance(x, float) for x in pure[0])
        # Told the heads it learnt, each says so instead of giving them again.
        heads = pure[2]
        again = _scan_block(spec, data, start, end, heads)
        again_fast = compiled(data, start, end, spec.wanted, spec.unwanted, heads)
        assert again is not None and again[2] is None
        assert _same(again, again_fast)
        changed = [*heads[:-1], heads[-1] + b"x"]
        assert compiled(data, start, end, spec.wanted, spec.unwanted, changed)[2] == heads


def test_values_read_as_float_reads_them() -> None:
    """The compiled scan's own number reading agrees with float() where it takes over."""
    assert compiled is not None
    tokens = [b"0", b"-0.0", b"1e308", b"1e309", b"4.9e-324", b"2.5e-324", b"0.1",
              b"123456789012345678901234567890", b"1.7976931348623157e308", b"9007199254740993",
              b"1E5", b"+1.5", b"NaN", b"nan", b"-Infinity"]  # fmt: skip
    data = b"".join(b"vllm:prompt_tokens_total " + t + b" 5\n" for t in tokens)
    values, stamp, _heads = compiled(data, 0, len(data), COUNTER.wanted, COUNTER.unwanted, None)
    assert stamp == b"5"
    for token, value in zip(tokens, values, strict=True):
        expected = float(token)
        assert struct.pack("<d", value) == struct.pack("<d", expected) or (
            math.isnan(value) and math.isnan(expected)
        ), token


def test_bad_arguments_raise_not_crash() -> None:
    assert compiled is not None
    with pytest.raises(ValueError):
        compiled(b"abc\n", 0, 99, COUNTER.wanted, COUNTER.unwanted, None)
    with pytest.raises(ValueError):
        compiled(b"abc\n", 3, 1, COUNTER.wanted, COUNTER.unwanted, None)
    with pytest.raises(TypeError):
        compiled(b"abc\n", 0, 4, ("x",), (), None)


@pytest.mark.parametrize("name", ["8b-offload", "8b-nooffload"])
def test_every_block_of_the_real_captures_scans_alike(name: str) -> None:
    """Each wanted family block of the H200 capture as a recording: the same answer both ways,
    and a bulk answer for the blocks vLLM writes (no odd lines in them)."""
    assert compiled is not None
    data = recording_text(h200_scrapes(name), instance="h200:8000").encode()
    bulk = 0
    pos = 0
    while (pos := data.find(b"# TYPE ", pos)) != -1:
        eol = data.index(b"\n", pos)
        _hash, _type, raw, mtype = data[pos:eol].split(b" ")
        spec = _family(raw, mtype)
        end = data.find(b"\n#", eol) + 1
        if spec.wanted:
            pure = _scan_block(spec, data, eol + 1, end, None)
            fast = compiled(data, eol + 1, end, spec.wanted, spec.unwanted, None)
            assert _same(pure, fast), raw
            bulk += pure is not None
        pos = end
    assert bulk > 10


# -- the strict layout's scan (scan_series) --------------------------------------------------

_SERIES_ODDITIES = [None] * 4 + ["foreign", "blank", "back", "nan time", "value", "same time"]


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
            odd = draw(st.sampled_from(_SERIES_ODDITIES))
            points = draw(st.integers(1, 6))
            odd_at = draw(st.integers(0, points - 1))
            t = 1.8e9
            for k in range(points):
                here = odd if k == odd_at else None
                t += 0.0 if here == "same time" else 15.0
                stamp = b"NaN" if here == "nan time" else repr(t - 60 * (here == "back")).encode()
                value = draw(st.sampled_from([b"NaN"]) if here == "value" else _NUMBERS)
                name = b"vllm:other_total" if here == "foreign" else raw + b"_total"
                head = name + (b'{model_name="a b"}' if here == "blank" else labels)
                out.append(head + b" " + value + b" " + stamp + b"\n")
                out.append(raw + b"_created" + labels + b" 1.7e9 " + stamp + b"\n")
    return b"".join(out) + b"# EOF\n"


def _columns_read(path: str, compiled_scan: bool) -> object:
    """What the strict reader makes of a file: each series' times and values, and which
    instances declared each family ("declined" when it declines the file)."""
    saved = fastjournal.COMPILED
    fastjournal.COMPILED = compiled_scan
    try:
        with fastjournal._mapped(path) as mm:
            columns, _instances, users = faststrict._read_columns(mm, None)
    except fastjournal.Declined:
        return "declined"
    finally:
        fastjournal.COMPILED = saved
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
