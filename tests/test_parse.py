import pytest

from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import ParseError, iter_openmetrics, parse_text

from helpers import SAMPLE


def test_sample_parses_with_every_family():
    expo = parse_text(SAMPLE.read_bytes())
    assert "vllm:kv_offload_load_bytes" in expo.families  # counter family, _total stripped
    assert expo.families["vllm:kv_offload_allocation_failure"] == "counter"
    names = {s[0] for s in expo.samples}
    assert "vllm:kv_offload_load_bytes_total" in names
    assert "vllm:kv_offload_load_bytes_created" in names


def test_filter_keeps_only_catalog_samples():
    expo = parse_text(SAMPLE.read_bytes(), wanted, WANTED_FAMILIES)
    names = {s[0] for s in expo.samples}
    assert "vllm:request_prompt_tokens_bucket" not in names
    assert "vllm:prefix_cache_hits_total" in names
    # _created are read for reset detection, never as values (see test_figures)
    assert "vllm:prefix_cache_hits_created" in names


def test_labels_with_escapes_and_commas():
    body = 'm{a="x,\\"y\\"",b="back\\\\slash",c="new\\nline"} 1.5\n'
    ((name, labels, value, ts),) = parse_text(body).samples
    assert labels == {"a": 'x,"y"', "b": "back\\slash", "c": "new\nline"}
    assert (name, value, ts) == ("m", 1.5, None)


def test_colon_escaped_names_are_canonical():
    ((name, *_),) = parse_text("vllm_kv_offload_load_bytes_total 3\n").samples
    assert name == "vllm:kv_offload_load_bytes_total"


@pytest.mark.parametrize(
    "body, message",
    [
        (b"\x00\x01\x02garbage", "NUL"),
        (b"\xff\xfe\xfd", "UTF-8"),
        ('vllm:x{engine="0" 1\n', "label"),
        ('vllm:x{engine="0"} abc\n', "bad number"),
        ("<html><body>oops</body></html>\n", "not a metric line"),
        ("vllm:x\n", "without a value"),
        ("# TYPE broken\n", "TYPE"),
    ],
)
def test_garbage_is_one_line_error(body, message):
    with pytest.raises(ParseError) as err:
        parse_text(body)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_openmetrics_stream_splits_scrapes_by_timestamp():
    text = [
        "# TYPE a counter\n",
        'a_total{x="1"} 1 10.0\n',
        "# TYPE b gauge\n",
        "b 2 10.0\n",
        "# TYPE a counter\n",
        'a_total{x="1"} 3 20.0\n',
        "# TYPE b gauge\n",
        "b 4 20.0\n",
        "# EOF\n",
    ]
    scrapes = list(iter_openmetrics(text))
    assert [s.timestamp for s in scrapes] == [10.0, 20.0]
    assert scrapes[1].families == {"a": "counter", "b": "gauge"}
    assert [v for _, _, v, _ in scrapes[1].samples] == [3, 4]


def test_openmetrics_without_eof_is_truncated():
    with pytest.raises(ParseError, match="truncated"):
        list(iter_openmetrics(["a 1 10.0\n"]))


def test_openmetrics_time_going_back_is_rejected():
    with pytest.raises(ParseError, match="back in time"):
        list(iter_openmetrics(["a 1 10.0\n", "b 1 5.0\n", "# EOF\n"]))


@pytest.mark.parametrize(
    "label_text, expected",
    [
        ('a="1",b="2"', {"a": "1", "b": "2"}),
        ('a="1",', {"a": "1"}),
        ('a="1", b="x,y"', {"a": "1", "b": "x,y"}),
        ('a="say \\"hi\\"",b="2"', {"a": 'say "hi"', "b": "2"}),
        ('a="",b="=\\""', {"a": "", "b": '="'}),
    ],
)
def test_label_sets_fast_and_slow_paths_agree(label_text, expected):
    ((_, labels, value, _),) = parse_text(f"m{{{label_text}}} 2\n").samples
    assert labels == expected and value == 2


def test_blank_crlf_lines_are_blank():
    body = 'vllm:x{engine="0"} 1\r\n\r\nvllm:y 2\r\n'
    assert [s[0] for s in parse_text(body).samples] == ["vllm:x", "vllm:y"]


@pytest.mark.parametrize("chunk_size", [64, 4096, 1 << 22])
def test_filtered_streaming_keeps_exactly_what_a_full_parse_keeps(chunk_size):
    # The filtered scan jumps over families and over runs of unwanted sample names (histogram
    # buckets); whatever it jumps, it must keep the very samples a full parse + filter keeps,
    # whatever the chunk boundaries. Real vLLM bodies (H200), several scrapes.
    import io

    from kvoffload.ingest.parse import read_chunks

    from helpers import h200_scrapes, recording_text

    text = recording_text(h200_scrapes()[:6])

    def scrapes(wanted_fn, families):
        chunks = read_chunks(io.StringIO(text), chunk_size)
        return [
            [(n, lb, v, ts) for n, lb, v, ts in e.samples if wanted(n)]
            for e in iter_openmetrics(chunks, wanted_fn, families)
        ]

    filtered = scrapes(wanted, WANTED_FAMILIES)
    assert filtered == scrapes(None, None)
    assert sum(map(len, filtered)) > 100
    # parse_text (live scrapes) agrees with itself the same way
    body = h200_scrapes()[3][1]
    full = [s for s in parse_text(body).samples if wanted(s[0])]
    assert parse_text(body, wanted, WANTED_FAMILIES).samples == full


def test_a_filter_decides_for_itself_whatever_another_filter_cached():
    body = 'a_total{x="1"} 1\nb_total{x="1"} 2\n'
    assert [s[0] for s in parse_text(body).samples] == ["a_total", "b_total"]
    only_b = parse_text(body, lambda name: name == "b_total").samples
    assert [s[0] for s in only_b] == ["b_total"]
    assert [s[0] for s in parse_text(body).samples] == ["a_total", "b_total"]
    for i in range(20):  # fresh filters every call: the per-filter caches stay bounded
        parse_text(body, lambda name, i=i: name == "a_total")
    from kvoffload.ingest import parse

    assert len(parse._HEAD_CACHES) <= 8


def test_a_recording_cut_short_keeps_its_complete_scrapes(caplog):
    """A recorder killed mid-run (SIGKILL) leaves no '# EOF': every scrape before the last
    one is whole and read; the last, possibly half-written, is dropped with a warning."""
    scrapes = list(iter_openmetrics(["a 1 10.0\n", "a 2 20.0\n", "a 3 30.0\n"]))
    assert [s.timestamp for s in scrapes] == [10.0, 20.0]
    assert "truncated recording" in caplog.text and "2 complete scrapes" in caplog.text


@pytest.mark.parametrize(
    "body",
    [
        "vllm:a-b 1\n",
        'vllm:prompt_tokens_é{engine="0"} 1\n',
        "# TYPE vllm:a.b counter\nvllm:a 1\n",
        "  vllm:a/b 1\n",
        'vllm:x\t{a="1"} 1\n'.replace("x", "x$"),
    ],
    ids=["dash", "utf8", "type-line", "spaced", "tabbed"],
)
def test_a_metric_name_prometheus_rejects_is_refused(body):
    """Prometheus 2.x (the 2.42 we target) reads only [a-zA-Z_:][a-zA-Z0-9_:]* names, quoted
    UTF-8 names came with 3.0 (#25 item 11: the parser took `vllm:a-b` before)."""
    with pytest.raises(ParseError, match=r"line \d+: invalid metric name"):
        parse_text(body)
