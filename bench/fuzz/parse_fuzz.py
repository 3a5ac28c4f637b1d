"""Fuzz target (atheris, coverage-guided): kvoffload's text-format parser against
prometheus_client's, on any bytes.

Every input must:
- parse, or raise ParseError (with a one-line message): any other exception is a crash;
- when the full parse reads it, be read by the sidecar's filtered parse (the catalog's filter)
  with exactly the full parse's wanted samples and the same families;
- when it is valid text format as Prometheus reads it (`valid`, below: the grammar of
  model/textparse/promlex.l, tokens separated by any blanks and tabs), be read, with the same
  samples and families as prometheus_client reads (a counter's samples under the name they
  were written with, as Prometheus keeps them; prometheus_client appends `_total`).

Run (atheris is no dependency of kvoffload: `.venv/bin/pip install atheris`):

    .venv/bin/python bench/fuzz/parse_fuzz.py --seed-corpus /tmp/parse-corpus
    .venv/bin/python bench/fuzz/parse_fuzz.py -runs=1000000 -max_len=4096 /tmp/parse-corpus

The corpus directory is seeded (`--seed-corpus DIR` writes snippets of the real vLLM bodies
and the whitespace cases) and grows with the inputs that reach new code. With
PARSE_FUZZ_LOG=FILE a finding is written to FILE (one JSON line: kind, input) and the run goes
on, so one long run counts every kind of finding; without it the first finding stops the run
and atheris saves the input (crash-*), as usual.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from prometheus_client.parser import _split_quoted, text_string_to_metric_families

    from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
    from kvoffload.ingest.parse import ParseError, canonical_name, parse_text

# -- the text format as Prometheus reads it (promlex.l + promparse.go), line by line --------
_B = r"[ \t]"
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LNAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LVALUE = r'"(?:[^"\\\n]|\\.)*"'
_PAIR = rf"{_LNAME}{_B}*={_B}*{_LVALUE}"
_LABELS = rf"\{{{_B}*(?:{_PAIR}{_B}*(?:,{_B}*{_PAIR}{_B}*)*(?:,{_B}*)?)?\}}"
# Go's strconv.ParseFloat less hex and underscores (promparse rejects p, P and _); range below.
_FLOAT = r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|(?i:inf|infinity))|(?i:nan)"
_SAMPLE = re.compile(
    rf"{_B}*({_NAME})(?:{_B}*({_LABELS})|(?={_B})){_B}*({_FLOAT})(?:{_B}+(\d+))?{_B}*\Z"
)
_PAIRS = re.compile(rf"({_LNAME}){_B}*={_B}*{_LVALUE}")
_TYPE = re.compile(
    rf"{_B}*#{_B}+TYPE{_B}+({_NAME}){_B}+(counter|gauge|histogram|summary|untyped){_B}*\Z"
)
_HELP = re.compile(rf"{_B}*#{_B}+HELP{_B}+{_NAME}(?:{_B}[^\n]*)?\Z")
_META = re.compile(rf"{_B}*#{_B}+(?:HELP|TYPE)(?:{_B}|\Z)")
_BLANK = re.compile(rf"{_B}*\Z")
_COMMENT = re.compile(rf"{_B}*#")


def valid(text: str) -> tuple[bool, bool]:
    """(valid text format as Prometheus reads it, prometheus_client reads it the same way).

    The second is False where prometheus_client departs from Prometheus on valid input (label
    names beginning with `__`, which it rejects; a comment whose second word is TYPE or HELP,
    which it reads as such; a counter declared both with and without `_total`; timestamps over
    2^53 ms, which it divides exactly and kvoffload in floats)."""
    if "\x00" in text or (text and not text.endswith("\n")):
        return False, False
    same = True
    counters: dict[str, set[bool]] = {}
    for line in text.split("\n")[:-1]:
        if _BLANK.match(line):
            continue
        if _COMMENT.match(line):
            m = _TYPE.match(line)
            if m:
                if m.group(2) == "counter":
                    base = canonical_name(m.group(1))
                    total = base.endswith("_total")
                    counters.setdefault(base.removesuffix("_total"), set()).add(total)
                continue
            if _HELP.match(line):
                continue
            if _META.match(line):
                return False, False  # a HELP or TYPE line that is not one
            parts = _split_quoted(line.strip(), None, 3)
            if len(parts) >= 2 and parts[1] in ("TYPE", "HELP"):
                same = False
            continue
        m = _SAMPLE.match(line)
        if m is None:
            return False, False
        value = m.group(3)
        if value[-1].isdigit() and math.isinf(float(value)):
            return False, False  # out of float64's range: ParseFloat's ErrRange
        if m.group(4) is not None:
            if int(m.group(4)) >= 2**63:
                return False, False
            if int(m.group(4)) > 2**53:
                same = False
        if m.group(2):
            names = _PAIRS.findall(m.group(2))
            if len(set(names)) != len(names):
                return False, False  # duplicate label names: the scrape fails
            if any(name.startswith("__") for name in names):
                same = False
    if any(len(kinds) > 1 for kinds in counters.values()):
        same = False
    return True, same


def _reference(text: str) -> tuple[list, dict[str, str]]:
    """prometheus_client's reading, flat, in kvoffload's terms (see test_parse_differential)."""
    bare = {
        canonical_name(m.group(1))
        for m in map(_TYPE.match, text.split("\n"))
        if m and m.group(2) == "counter" and not m.group(1).endswith("_total")
    }
    samples, families = [], {}
    for family in text_string_to_metric_families(text):
        name = canonical_name(family.name)
        if family.type != "unknown":
            families[name] = family.type
        for s in family.samples:
            sample_name = canonical_name(s.name)
            if family.type == "counter" and name in bare:
                sample_name = sample_name.removesuffix("_total")
            samples.append((sample_name, s.labels, float(s.value), s.timestamp))
    return samples, families


def _key(samples: list) -> list:
    return [(n, lb, "NaN" if math.isnan(v) else v, ts) for n, lb, v, ts in samples]


_LOG = os.environ.get("PARSE_FUZZ_LOG")
_SEEN: set[str] = set()


def _finding(kind: str, data: bytes) -> None:
    if _LOG is None:
        raise AssertionError(kind)
    with open(_LOG, "a") as fh:  # every one, so a run can be counted; kinds deduplicated below
        fh.write(json.dumps({"kind": kind, "input": data.decode("latin-1")}) + "\n")
    if kind not in _SEEN:
        _SEEN.add(kind)
        print(f"FINDING {kind}: {data[:200]!r}", file=sys.stderr, flush=True)


def test_one_input(data: bytes) -> None:
    try:
        full = parse_text(data)
    except ParseError as exc:
        if "\n" in str(exc):
            _finding("multi-line error", data)
        full = None
    except Exception as exc:  # a crash: anything but the documented error
        _finding(f"crash {type(exc).__name__}", data)
        return
    try:
        filtered = parse_text(data, wanted, WANTED_FAMILIES)
    except ParseError:
        filtered = None
    except Exception as exc:
        _finding(f"crash filtered {type(exc).__name__}", data)
        return
    if full is not None:
        if filtered is None:
            _finding("filtered parse fails where the full parse reads", data)
        elif _key(filtered.samples) != _key([s for s in full.samples if wanted(s[0])]):
            _finding("filtered parse keeps other samples than the full parse", data)
        elif filtered.families != full.families:
            _finding("filtered parse declares other families", data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    is_valid, comparable = valid(text)
    if not is_valid:
        return
    if full is None:
        _finding("valid text format rejected", data)
        return
    if not comparable:
        return
    try:
        theirs, their_families = _reference(text)
    except Exception as exc:
        _finding(f"prometheus_client rejects valid text format ({type(exc).__name__})", data)
        return
    if _key(full.samples) != _key(theirs):
        _finding("samples differ from prometheus_client", data)
    ours = {name: mtype for name, mtype in full.families.items() if mtype != "untyped"}
    if ours != their_families:
        _finding("families differ from prometheus_client", data)


def seed_corpus(directory: Path) -> None:
    """Snippets of the real vLLM bodies (a few families each) and the whitespace cases."""
    directory.mkdir(parents=True, exist_ok=True)
    fixtures = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
    bodies = [fixtures / "vllm-0.33-offload-sample.prom"]
    bodies += sorted((fixtures / "vllm-0.26-h200-capture" / "8b-offload").glob("*.prom"))[:2]
    n = 0
    for path in bodies:
        lines = path.read_text().splitlines(keepends=True)
        for start in range(0, len(lines), 40):
            (directory / f"seed-{n:04d}").write_text("".join(lines[start : start + 40]))
            n += 1
    cases = [
        "a\t100\n",
        "a 100\t1700000000000\n",
        "a\t100 1700000000000\n",
        'a {x="1"} 1\n',
        'a\t{x="1"} 1\n',
        '  # TYPE a counter\n\ta_total{ x = "1" , } 1\n',
        '#\tTYPE\tb  histogram \nb_bucket{le="+Inf"} 3\nb_count 3\nb_sum 1.5\n',
        "# TYPE vllm:x gauge\nvllm:x 1\nvllm:prefix_cache_hits_total 2\n",
        'm{a="x,\\"y\\"",b="back\\\\slash",c="new\\nline"} 1.5\n',
    ]
    for case in cases:
        (directory / f"seed-{n:04d}").write_text(case)
        n += 1


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seed-corpus":
        seed_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
