"""Prometheus text exposition (0.0.4) and OpenMetrics parsing, fast and strict enough.

Why fast: the sidecar parses every scrape. So the hot path skips unwanted samples by name and
parses labels only for kept ones. Errors are `ParseError`, one line naming the line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

from kvoffload.errors import InputError

log = logging.getLogger("kvoffload")

# A sample: (name, labels, value, timestamp in seconds or None).
Sample = tuple[str, dict[str, str], float, float | None]

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,\s*)?')
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
# A sample line's name: up to the first blank, tab or brace (the text format's separators).
_NAME_TOKEN = re.compile(r"[^ \t{]+")
# `#`, blanks or tabs, `TYPE`, a blank or tab: a TYPE line however it is spaced.
_TYPE_COMMENT = re.compile(r"#[ \t]+TYPE[ \t]")
# A metric name as Prometheus 2.x reads it in both text formats (promlex.l, openmetricslex.l):
# no quoted UTF-8 names before 3.0, so `vllm:a-b` or `vllm:é` fail the scrape there too.
_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


class ParseError(InputError):
    """The payload is not valid Prometheus text exposition."""


class LimitError(ParseError):
    """The payload is valid but over a limit of the scrape (`Limits`); `limit` names which."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class Limits:
    """What one scrape may hold, like Prometheus' `sample_limit`, `label_value_length_limit`.

    `samples`: samples kept; `label_value_bytes`: a kept sample's longest label value in UTF-8
    bytes; 0: no limit. Checked while parsing, so a payload over one is abandoned at that point.
    """

    samples: int = 0
    label_value_bytes: int = 0


def _too_long(labels: dict[str, str], limit: int) -> str | None:
    """The first label whose value is over `limit` bytes."""
    for name, value in labels.items():
        if len(value) > limit // 4 and len(value.encode()) > limit:
            return name
    return None


@dataclass
class Exposition:
    """One scrape: the families declared (name → type) and the samples that were kept."""

    families: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    timestamp: float | None = None


def family_name(name: str, mtype: str) -> str:
    """Normalise a TYPE line's name: 0.0.4 counters carry `_total`, OpenMetrics ones do not."""
    if mtype == "counter" and name.endswith("_total"):
        return name[:-6]
    return name


def canonical_name(name: str) -> str:
    """vLLM names with the colon escaped (`vllm_...`, Prometheus 2 + OpenMetrics) → `vllm:...`."""
    if name.startswith("vllm_"):
        return "vllm:" + name[5:]
    return name


def _metric_name(raw: str, lineno: int | Callable[[], int]) -> str:
    """`raw` when it is a valid metric name, else a ParseError naming the line."""
    if _METRIC_NAME_RE.match(raw) is None:
        at = lineno if isinstance(lineno, int) else lineno()
        raise ParseError(
            f"line {at}: invalid metric name {raw[:80]!r} (Prometheus takes "
            "[a-zA-Z_:][a-zA-Z0-9_:]*)"
        )
    return raw


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


# Label sets repeat scrape after scrape (same series): parse each text once. The dicts are
# shared, so callers must not mutate them (they copy: `{**labels, ...}`).
_LABEL_CACHE: dict[str, dict[str, str]] = {}
_LABEL_CACHE_MAX = 100_000


class _CacheBytes:
    """What a cache holds, in bytes (estimated: the key, the values sliced from it, the entry).

    Why: caches are bounded in bytes, so ever-new 1 MB label values cannot grow them. A key over
    `_CACHE_KEY_MAX` is never cached; a cache over its budget starts over.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0

    def admit(self, cache: dict[str, Any], key: str) -> bool:
        """Whether to cache `key`: room made (the cache emptied) when over the budget."""
        size = len(key)
        if size > _CACHE_KEY_MAX:
            return False
        cost = 2 * size + _CACHE_ENTRY_BYTES
        if self.used + cost > self.budget or len(cache) >= _LABEL_CACHE_MAX:
            cache.clear()
            self.used = 0
        self.used += cost
        return True


_CACHE_KEY_MAX = 64 * 2**10
_CACHE_ENTRY_BYTES = 256  # the dict slot, the key and value objects, a small label dict
_LABEL_BYTES = _CacheBytes(32 * 2**20)


# The same series come back in every scrape: `name{labels}` → (canonical name, labels), or
# _UNWANTED, per filter, so a line costs a dict lookup and its numbers.
_UNWANTED: tuple[str, dict[str, str]] = ("", {})
_HEAD_CACHES: dict[Callable[[str], bool] | None, dict[str, tuple[str, dict[str, str]]]] = {}
_HEAD_BYTES: dict[Callable[[str], bool] | None, _CacheBytes] = {}


def _parse_labels(text: str, lineno: int) -> dict[str, str]:
    labels = _LABEL_CACHE.get(text)
    if labels is None:
        labels = _parse_labels_uncached(text, lineno)
        if _LABEL_BYTES.admit(_LABEL_CACHE, text):
            _LABEL_CACHE[text] = labels
    return labels


def _parse_labels_uncached(text: str, lineno: int) -> dict[str, str]:
    if "\\" not in text and text.endswith('"'):
        # Fast path for the common, escape-free label set: without a backslash no value can
        # hold a quote, so '",' only ever separates pairs.
        labels = {}
        for pair in text[:-1].split('",'):
            key, sep, value = pair.partition('="')
            key = key.strip().lstrip(",").strip()
            if not sep or not key or not _LABEL_NAME_RE.match(key) or '"' in value:
                return _parse_labels_slow(text, lineno)
            labels[key] = value
        return labels
    return _parse_labels_slow(text, lineno)


def _parse_labels_slow(text: str, lineno: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    end = len(text.rstrip())  # `{ }`: blanks alone are no label
    while pos < end:
        m = _LABEL_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise ParseError(f"line {lineno}: malformed labels {{{text[:80]}}}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def _parse_float(token: str, lineno: int) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"line {lineno}: bad number {token[:40]!r}") from None


def _parse_sample_line(
    line: str, lineno: int, wanted: Callable[[str], bool] | None
) -> Sample | None:
    if line[0] not in _NAME_START:
        return _parse_sample_spaced(line, lineno, wanted)  # leading blanks, or no sample
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        if close < brace:
            raise ParseError(f"line {lineno}: unterminated label set: {line[:80]!r}")
        head = line[: close + 1]
        cache = _HEAD_CACHES.get(wanted)
        if cache is None:
            if len(_HEAD_CACHES) >= 8:  # a caller passing a new filter each time: start over
                _HEAD_CACHES.clear()
                _HEAD_BYTES.clear()
            _HEAD_BYTES[wanted] = _CacheBytes(32 * 2**20)  # first: another thread may look
            cache = _HEAD_CACHES[wanted] = {}
        known = cache.get(head)
        if known is None:
            raw = line[:brace]
            if "\t" in raw:  # `name\t{` (`name {` goes the spaced way: a blank comes first)
                raw = _name_token(raw.rstrip(" \t"), line, lineno)
            name = canonical_name(_metric_name(raw, lineno))
            if wanted is not None and not wanted(name):
                known = _UNWANTED
            else:
                known = name, _parse_labels(line[brace + 1 : close], lineno)
            budget = _HEAD_BYTES.get(wanted)
            if budget is not None and budget.admit(cache, head):
                cache[head] = known
        if known is _UNWANTED:
            return None
        name, labels = known
        rest = line[close + 1 :].split()
    else:
        if space == -1 or brace != -1:  # tabs only, or a blank before the labels
            return _parse_sample_spaced(line, lineno, wanted)
        raw = line[:space]
        if "\t" in raw:  # `name\tvalue timestamp`
            return _parse_sample_spaced(line, lineno, wanted)
        name = canonical_name(_metric_name(raw, lineno))
        if wanted is not None and not wanted(name):
            return None
        labels = {}
        rest = line[space + 1 :].split()
    if len(rest) == 2:
        try:
            return name, labels, float(rest[0]), float(rest[1])
        except ValueError:
            pass  # say which number below
    elif len(rest) == 1:
        return name, labels, _parse_float(rest[0], lineno), None
    else:
        raise ParseError(f"line {lineno}: expected 'value [timestamp]': {line[:80]!r}")
    return name, labels, _parse_float(rest[0], lineno), _parse_float(rest[1], lineno)


def _parse_sample_spaced(
    line: str, lineno: int, wanted: Callable[[str], bool] | None
) -> Sample | None:
    """A sample line in its general form, off the fast path: any blanks and tabs around tokens.

    Prometheus reads `name\t{l="v"} 1\t1700000000000` as `name{l="v"} 1 1700000000000`.
    """
    text = line.strip(" \t")
    if not text or (text[0] == "#" and line[0] in " \t"):
        return None  # an indented blank or comment line: the caller reads it from its first token
    if text[0] not in _NAME_START:
        raise ParseError(f"line {lineno}: not a metric line: {line[:60]!r}")
    m = _NAME_TOKEN.match(text)
    assert m is not None  # text[0] is a name character
    name = canonical_name(_metric_name(m.group(), lineno))
    rest = text[m.end() :].lstrip(" \t")
    if rest[:1] == "{":
        close = rest.rfind("}")
        if close == -1:
            raise ParseError(f"line {lineno}: unterminated label set: {line[:80]!r}")
        if wanted is not None and not wanted(name):
            return None
        labels = _parse_labels(rest[1:close], lineno)
        tokens = rest[close + 1 :].split()
    else:
        if wanted is not None and not wanted(name):
            return None
        labels = {}
        tokens = rest.split()
    if len(tokens) == 1:
        return name, labels, _parse_float(tokens[0], lineno), None
    if len(tokens) == 2:
        return name, labels, _parse_float(tokens[0], lineno), _parse_float(tokens[1], lineno)
    if not tokens:
        raise ParseError(f"line {lineno}: sample without a value: {line[:80]!r}")
    raise ParseError(f"line {lineno}: expected 'value [timestamp]': {line[:80]!r}")


def _name_token(name: str, line: str, lineno: int) -> str:
    """`name`, the text before a line's label set, if it is one token."""
    if not name or "\t" in name or " " in name:
        raise ParseError(f"line {lineno}: not a metric name before the labels: {line[:80]!r}")
    return name


def _decode(body: bytes | str) -> str:
    if isinstance(body, str):
        text = body
    else:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"not text: invalid UTF-8 at byte {exc.start}") from None
    if "\x00" in text:
        raise ParseError("not text: payload contains NUL bytes")
    return text


def parse_text(
    body: bytes | str,
    wanted: Callable[[str], bool] | None = None,
    wanted_families: frozenset[str] | set[str] | None = None,
    limits: Limits | None = None,
) -> Exposition:
    """Parse one classic (0.0.4) exposition; `wanted(name)` keeps a sample (None: keep all).

    Over one of `limits`, `LimitError` as soon as that sample is read. With `wanted_families`
    (catalog.WANTED_FAMILIES), a family none of them names is skipped with one search. Timestamps
    (milliseconds in 0.0.4) become seconds.
    """
    text = _decode(body)
    expo = Exposition()
    families = expo.families
    samples = expo.samples
    pos = 0
    size = len(text)
    find = text.find
    compiles = [_SKIP_COMPILES]  # new family skips this parse may compile
    plans = _skip_plans(wanted_families) if wanted_families is not None else {}
    max_samples, max_value = (limits.samples, limits.label_value_bytes) if limits else (0, 0)
    while pos < size:
        end = find("\n", pos)
        if end == -1:
            end = size
        line = text[pos:end]
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            pos = end + 1
            continue
        if line[0] == "#":
            if line.startswith("# TYPE ") or (
                not line.startswith("# HELP ") and _TYPE_COMMENT.match(line) is not None
            ):
                fam, mtype = _TYPE_LINES.get(line) or _type_line(line, partial(_lineno, text, pos))
                families[fam] = mtype
                if wanted_families is not None and fam not in wanted_families:
                    search = plans.get(line) or _skip_plan(line, plans, wanted_families, compiles)
                    found = search(text, end)  # past the family's samples
                    pos = found.end() if found is not None else size
                    continue
            pos = end + 1
            continue
        try:
            sample = _parse_sample_line(line, 0, wanted)
        except ParseError as exc:
            raise _at_line(exc, _lineno(text, pos)) from None
        pos = end + 1
        if sample is None:
            if line[0] in " \t" and (rest := line.lstrip(" \t"))[:1] in ("#", ""):
                # An indented comment or blank line: read again from its first token.
                pos = pos - 1 - len(rest) - (text[end - 1 : end] == "\r")
                continue
            pos = _skip_same_name(text, pos, line)
            continue
        if sample[3] is not None:
            sample = (sample[0], sample[1], sample[2], sample[3] / 1000.0)
        samples.append(sample)
        if max_samples and len(samples) > max_samples:
            raise _over_sample_limit(max_samples, _lineno(text, pos - 1))
        # Only a line longer than the limit can hold a value over it: one comparison a line.
        if max_value and len(line) > max_value and (label := _too_long(sample[1], max_value)):
            raise _over_value_limit(label, max_value, _lineno(text, pos - 1))
    return expo


def _at_line(exc: ParseError, lineno: int) -> ParseError:
    """`exc`, raised by a sample line parsed as line 0, naming its line in the payload."""
    return ParseError(str(exc).replace("line 0:", f"line {lineno}:", 1))


def _over_sample_limit(max_samples: int, lineno: int) -> LimitError:
    return LimitError(
        "samples",
        f"more than {max_samples:,} samples (--scrape.sample-limit): abandoned at line {lineno}",
    )


def _over_value_limit(label: str, max_value: int, lineno: int) -> LimitError:
    return LimitError(
        "label_value_length",
        f"line {lineno}: label {label} longer than {max_value:,} "
        "bytes (--scrape.label-value-length-limit)",
    )


def _no_timestamp(lineno: int) -> ParseError:
    return ParseError(f"line {lineno}: recording sample without a timestamp")


def _check_nul(text: str, lineno: Callable[[str, int], int]) -> None:
    """Refuse a chunk holding a NUL byte: one scan of the chunk instead of one per line."""
    nul = text.find("\x00")
    if nul != -1:
        raise ParseError(f"line {lineno(text, nul)}: not text: NUL byte")


def _back_in_time(ts: float, last: float | None, lineno: int) -> ParseError:
    return ParseError(
        f"line {lineno}: timestamp {ts} goes back in time (after {last}); recordings must be "
        "written scrape by scrape"
    )


def _lineno(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# TYPE lines read before → (family, type): a target's come back every scrape (~100 of them).
_TYPE_LINES: dict[str, tuple[str, str]] = {}
_TYPE_LINES_MAX = 10_000


def _type_line(line: str, lineno: Callable[[], int]) -> tuple[str, str]:
    """`# TYPE name type` → (normalised family name, type); lineno is computed on error only."""
    known = _TYPE_LINES.get(line)
    if known is not None:
        return known
    parts = line.split()
    if len(parts) != 4:
        raise ParseError(f"line {lineno()}: malformed TYPE line: {line[:80]!r}")
    known = family_name(canonical_name(_metric_name(parts[2], lineno)), parts[3]), parts[3]
    if len(_TYPE_LINES) >= _TYPE_LINES_MAX:
        _TYPE_LINES.clear()
    if len(line) <= 1024:  # a longer TYPE line is no family name that repeats
        _TYPE_LINES[line] = known
    return known


# Family skips: per set of wanted families, TYPE line → the search that finds the first line
# after the family's samples (a match ending where reading goes on).
_Search = Callable[[str, int], "re.Match[str] | None"]
_SKIP_PLANS: dict[frozenset[str], dict[str, _Search]] = {}
_SKIP_PLANS_MAX = 4096  # TYPE lines planned, per set of wanted families
_SKIP_COMPILES = 64  # new plans per parse (~80 us each): new TYPE lines by the thousand
_EVERY_LINE = re.compile("\n").search  # no plan: read on at the next line, as a full parse
# The suffixes a wanted name's family is found under (catalog._families_of strips the same).
FAMILY_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


def _skip_plans(wanted_families: frozenset[str] | set[str]) -> dict[str, _Search]:
    """The family skips planned for `wanted_families` (one lookup a parse)."""
    key = wanted_families if isinstance(wanted_families, frozenset) else frozenset(wanted_families)
    plans = _SKIP_PLANS.get(key)
    if plans is None:
        if len(_SKIP_PLANS) >= 8:  # a caller passing new families each time: start over
            _SKIP_PLANS.clear()
        plans = _SKIP_PLANS[key] = {}
    return plans


def _skip_plan(
    line: str,
    plans: dict[str, _Search],
    wanted_families: frozenset[str] | set[str],
    compiles: list[int],
) -> _Search:
    """How to skip an unwanted family's samples after its TYPE `line`.

    The plan is a search for the first line not provably one of them. It is `_EVERY_LINE` (look
    at each line) when the line is too long or `compiles` is spent (the plans still allowed).
    Why: the kept samples must equal a full parse's.
    """
    # Provably: the family's name plus one of FAMILY_SUFFIXES (or nothing) names no wanted family,
    # since `wanted_families` holds every wanted name's family. When no wanted family even begins
    # with the name, any line beginning with it is skipped (a cheaper search). The first other
    # line is read as usual, so a differently spelled sample (`vllm_x` after `# TYPE vllm:x`) is.
    if compiles[0] <= 0 or len(line) > 1024:
        return _EVERY_LINE
    compiles[0] -= 1
    parts = line.split()
    if len(parts) != 4:
        return _EVERY_LINE
    raw, mtype = parts[2], parts[3]
    base = raw[:-6] if mtype == "counter" and raw.endswith("_total") else raw
    family = canonical_name(base)
    if not any(name.startswith(family) for name in wanted_families):
        # Every name beginning with `base` begins with `family` once canonical: none is wanted.
        search = re.compile("\n(?!" + re.escape(base) + ")").search
    else:
        suffixes = "|".join(suffix[1:] for suffix in FAMILY_SUFFIXES)
        search = re.compile("\n(?!" + re.escape(base) + f"(?:_(?:{suffixes}))?[ \\t{{])").search
    if len(plans) >= _SKIP_PLANS_MAX:
        plans.clear()
    plans[line] = search
    return search


def _skip_same_name(text: str, pos: int, line: str) -> int:
    """Past the run of lines at `pos` named as `line` (not kept), such as a histogram's buckets."""
    brace, space = line.find("{"), line.find(" ")
    cut = brace if brace != -1 and (space == -1 or brace < space) else space
    if cut <= 0:
        return pos
    with_labels, bare = line[: cut + 1] if brace == cut else line[:cut] + "{", line[:cut] + " "
    startswith, find, size = text.startswith, text.find, len(text)
    while pos < size and (startswith(with_labels, pos) or startswith(bare, pos)):
        nl = find("\n", pos)
        pos = size if nl == -1 else nl + 1
    return pos


def _skip_in(search: _Search, text: str, start: int) -> tuple[int, _Search | None]:
    """Where reading goes on in a chunk after a skipped family's TYPE line ending at `start`.

    Also `search` again if the family's samples may go on in the next chunk.
    """
    found = search(text, start)
    return (len(text), search) if found is None else (found.end(), None)


def _skip_on(search: _Search, text: str) -> tuple[int, _Search | None]:
    """Where to read on in the next chunk, within a family skipped in the last one.

    That is its first line that is not one of the family's samples.
    """
    if (first := search("\n" + text[:1100], 0)) is not None and first.start() == 0:
        return 0, None  # (a TYPE line over 1,024 characters has no search of its own)
    return _skip_in(search, text, 0)


def iter_openmetrics(
    chunks: Iterable[str],
    wanted: Callable[[str], bool] | None = None,
    wanted_families: frozenset[str] | set[str] | None = None,
    unordered: bool = False,
    journal: str | None = None,
    tmp_dir: str | None = None,
) -> Iterator[Exposition]:
    """Stream the scrapes of a recording (OpenMetrics, a timestamp on every sample).

    A scrape is a run of samples with one timestamp, and memory stays at one scrape. The
    `chunks` end at line boundaries (see `read_chunks`). With `unordered` (families or series
    contiguous), kept samples are first sorted by timestamp on disk (ingest.extsort, in `tmp_dir`).
    The `journal` path, when given, is named in the warning if the file was cut.
    """
    # TYPE lines between runs go to the next run; unwanted families are jumped over.
    state = _OMState(wanted, wanted_families, journal)
    if unordered:
        yield from _regrouped(state, chunks, tmp_dir)
        return
    for chunk in chunks:
        yield from state.feed(chunk)
    yield from state.finish()


# Sort keys of the regrouped layouts: the timestamp (16 hex digits), then the order in the file
# (10).
_TS_KEY = 16
_LINE_KEY = _TS_KEY + 10


def _regrouped(state: _OMState, chunks: Iterable[str], tmp_dir: str | None) -> Iterator[Exposition]:
    """Families or series contiguous → scrapes, by on-disk sort on (timestamp, file order).

    The sorted lines are parsed again one scrape at a time, mostly from the caches. Each was
    checked on the first pass, so no error comes from this one.
    """
    from kvoffload.ingest.extsort import sorted_lines

    wanted = state.wanted
    current: Exposition | None = None
    current_key = ""
    users: dict[str, set[str]] = {}  # family → instances with a series of it
    declared: dict[frozenset[str], dict[str, str]] = {}
    for keyed in sorted_lines(_keyed_samples(state, chunks, users), tmp_dir=tmp_dir):
        sample = _parse_sample_line(keyed[_LINE_KEY:-1], 0, wanted)
        assert sample is not None  # kept by the first pass
        if current is None or keyed[:_TS_KEY] != current_key:
            if current is not None:
                yield _with_families(current, state.all_families, users, declared)
            current_key = keyed[:_TS_KEY]
            current = Exposition(timestamp=sample[3])
        current.samples.append(sample)
    if current is None:
        raise ParseError("no samples with a timestamp (an empty recording?)")
    yield _with_families(current, state.all_families, users, declared)


def _with_families(
    expo: Exposition,
    families: dict[str, str],
    users: dict[str, set[str]],
    cache: dict[frozenset[str], dict[str, str]],
) -> Exposition:
    """The families a regrouped scrape declares.

    A scrape-ordered file says it exactly. Otherwise a scrape gets the families its target has
    series of anywhere, and those nobody has a series of. So a target without offloading is still
    judged without.
    """
    instances = frozenset({sample[1].get("instance", "") for sample in expo.samples})
    known = cache.get(instances)
    if known is None:
        known = cache[instances] = {
            fam: mtype
            for fam, mtype in families.items()
            if fam not in users or not users[fam].isdisjoint(instances)
        }
    expo.families = dict(known)
    return expo


def _keyed_samples(
    state: _OMState, chunks: Iterable[str], users: dict[str, set[str]]
) -> Iterator[str]:
    """The first pass of `_regrouped`: every kept sample line, prefixed by its sort key.

    TYPE lines go to `state.all_families`; skipped families are jumped over, their `instance` labels
    recorded in `users` (family → instances).
    """
    wanted, parse_line = state.wanted, _parse_sample_line
    ts_keys: dict[float, str] = {}
    cut_line = False
    seq = 0  # kept lines so far: ties of a timestamp keep their file order
    family = ""  # of the last TYPE line: the samples that follow are its
    last_seen = ("", "")
    for text in chunks:
        pos = 0
        size = len(text)
        find = text.find
        _check_nul(text, state._lineno)
        compiles = [_SKIP_COMPILES]
        if state.skip is not None:  # in a family skipped in the last chunk
            pos, state.skip = _skip_on(state.skip, text)
            _note_users(users, family, text, 0, pos)
        while pos < size:
            end = find("\n", pos)
            if end == -1:
                end = size
                # Only the last chunk can end without a newline: a file cut mid-line.
                cut_line = True
            line = text[pos:end]
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                pos = end + 1
                continue
            if state.saw_eof:
                raise ParseError(f"line {state._lineno(text, pos)}: content after '# EOF'")
            if line[0] == "#":
                cut_line = False
                state.skip = None
                if line == "# EOF":
                    state.saw_eof = True
                elif line.startswith("# TYPE "):
                    # (a strict file declares each family once: no per-scrape cost here)
                    family, pos = _keyed_type_line(state, users, text, pos, end, line, compiles)
                    continue
                pos = end + 1
                continue
            if cut_line:
                break  # judged below, with the '# EOF' question
            try:
                sample = parse_line(line, 0, wanted)
            except ParseError as exc:
                raise _at_line(exc, state._lineno(text, pos)) from None
            if sample is None:
                skipped = pos
                pos = _skip_same_name(text, end + 1, line)
                _note_users(users, family, text, skipped, pos)
                continue
            ts = sample[3]
            if ts is None:
                raise _no_timestamp(state._lineno(text, pos))
            seen = (family, sample[1].get("instance", ""))
            if seen != last_seen:  # a family's samples come together: one set.add per run
                users.setdefault(family, set()).add(seen[1])
                last_seen = seen
            pos = end + 1
            key = ts_keys.get(ts) or _new_ts_key(ts_keys, ts)
            yield f"{key}{seq:010x}{line}\n"
            seq += 1
        state.lines_before += text.count("\n")
    if not state.saw_eof:
        _warn_truncated(state.lines_before, cut_line)


def _new_ts_key(ts_keys: dict[float, str], ts: float) -> str:
    """The sort key of a timestamp not seen yet, kept (at most 100,000 of them)."""
    from kvoffload.ingest.extsort import float_key

    if len(ts_keys) >= 100_000:
        ts_keys.clear()
    key = ts_keys[ts] = float_key(ts)
    return key


def _warn_truncated(lines: int, cut_line: bool) -> None:
    # In these layouts a cut file misses whole series or families at its end, not the
    # last scrape: say so, and use what is there (bar a line cut in the middle).
    log.warning(
        "truncated recording: no '# EOF' after line %d (cut short?): families "
        "or series at its end may be missing%s",
        lines,
        "; its last, cut line dropped" if cut_line else "",
    )


def _keyed_type_line(
    state: _OMState,
    users: dict[str, set[str]],
    text: str,
    pos: int,
    end: int,
    line: str,
    compiles: list[int],
) -> tuple[str, int]:
    """A TYPE line at text[pos:end]: its family, and where to read on (past it when unwanted).

    The skipped samples' instances are noted in `users`.
    """
    fam, mtype = _TYPE_LINES.get(line) or _type_line(line, partial(state._lineno, text, pos))
    state.all_families[fam] = mtype
    if state.families is None or fam in state.families:
        return fam, end + 1
    plans = state.plans
    search = plans.get(line) or _skip_plan(line, plans, state.families, compiles)
    found = search(text, end)  # past the family's samples
    if found is not None:
        pos = found.end()
    else:  # which may go on in the next chunk
        pos, state.skip = len(text), search
    _note_users(users, fam, text, end, pos)
    return fam, pos


_INSTANCE_RE = re.compile(r'[{,]instance="((?:[^"\\]|\\.)*)"')


def _note_users(users: dict[str, set[str]], family: str, text: str, start: int, end: int) -> None:
    """The instances with series in text[start:end] (lines of `family` not parsed)."""
    found = set(_INSTANCE_RE.findall(text, start, end))
    if not found and text.find("\n", start, end - 1) != -1:
        found = {""}  # sample lines without an instance label
    if found:
        users.setdefault(family, set()).update(found)


def read_chunks(fh: TextIO, size: int = 4 * 2**20) -> Iterator[str]:
    """Blocks of about `size` characters, each cut after its last newline."""
    carry = ""
    while True:
        block = fh.read(size)
        if not block:
            if carry:
                yield carry
            return
        block = carry + block
        cut = block.rfind("\n")
        if cut == -1:
            carry = block
            continue
        carry = block[cut + 1 :]
        yield block[: cut + 1]


class _OMState:
    """The scanner behind iter_openmetrics, fed one chunk at a time."""

    def __init__(
        self,
        wanted: Callable[[str], bool] | None,
        wanted_families: frozenset[str] | set[str] | None,
        journal: str | None = None,
    ) -> None:
        self.wanted = wanted
        self.journal = journal
        self.families = wanted_families
        self.all_families: dict[str, str] = {}  # every TYPE line (regrouped layouts)
        self.current: Exposition | None = None
        self.pending: dict[str, str] = {}
        self.saw_eof = False
        self.cut_line = False
        # In a skipped family: the search for the first line after its samples (which may go
        # on in the next chunk), else None.
        self.skip: _Search | None = None
        self.plans = _skip_plans(wanted_families) if wanted_families is not None else {}
        self.lines_before = 0  # lines in the chunks already done
        self.complete = 0  # scrapes yielded (a later timestamp began: they are whole)

    def _lineno(self, text: str, pos: int) -> int:
        return self.lines_before + text.count("\n", 0, pos) + 1

    def feed(self, text: str) -> Iterator[Exposition]:
        pos = 0
        size = len(text)
        find = text.find
        _check_nul(text, self._lineno)
        compiles, plans = [_SKIP_COMPILES], self.plans
        if self.skip is not None:  # in a family skipped in the last chunk
            pos, self.skip = _skip_on(self.skip, text)
        wanted, parse_line, saw_eof = self.wanted, _parse_sample_line, self.saw_eof
        while pos < size:
            end = find("\n", pos)
            if end == -1:
                end = size
                if not saw_eof and text[pos:].rstrip("\r") not in ("", "# EOF"):
                    # Only the last chunk ends without a newline: the writer was killed in
                    # the middle of this line (a cut timestamp would read as a wrong time).
                    self.cut_line = True
                    break
            line = text[pos:end]
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                pos = end + 1
                continue
            if saw_eof:
                raise ParseError(f"line {self._lineno(text, pos)}: content after '# EOF'")
            if line[0] == "#":
                self.skip = None
                if line == "# EOF":
                    self.saw_eof = saw_eof = True
                elif line.startswith("# TYPE "):
                    fam, mtype = _TYPE_LINES.get(line) or _type_line(
                        line, partial(self._lineno, text, pos)
                    )
                    self.pending[fam] = mtype
                    self.all_families[fam] = mtype
                    if self.families is not None and fam not in self.families:
                        search = plans.get(line) or _skip_plan(line, plans, self.families, compiles)
                        found = search(text, end)  # past the family's samples
                        if found is not None:
                            pos = found.end()
                        else:  # which may go on in the next chunk
                            pos, self.skip = size, search
                        continue
                pos = end + 1
                continue
            try:
                sample = parse_line(line, 0, wanted)
            except ParseError as exc:
                raise _at_line(exc, self._lineno(text, pos)) from None
            pos = end + 1
            if sample is None:
                pos = _skip_same_name(text, pos, line)
                continue
            ts = sample[3]
            if ts is None:
                raise _no_timestamp(self._lineno(text, pos - 1))
            current = self.current
            if current is None or ts != current.timestamp:
                if current is not None:
                    if ts < current.timestamp:  # type: ignore[operator]
                        # Interleaved families of several timestamps: not a recording we
                        # wrote, and streaming it would give wrong windows.
                        raise _back_in_time(ts, current.timestamp, self._lineno(text, pos - 1))
                    self.complete += 1
                    yield current
                current = self.current = Exposition(timestamp=ts)
            if self.pending:
                current.families.update(self.pending)
                self.pending = {}
            current.samples.append(sample)
        self.lines_before += text.count("\n")

    def finish(self) -> Iterator[Exposition]:
        if not self.saw_eof:
            if not self.complete:
                raise ParseError(
                    f"truncated recording: no '# EOF' after line "
                    f"{self.lines_before} and no complete scrape"
                )
            # A recording cut short (its writer was killed): every scrape before the last is
            # whole; the last may be half-written, so it goes.
            if self.journal is not None:
                log.warning(
                    "%s is the journal of a recording that did not finish, truncated at line "
                    "%d (`record` was killed, or is still writing): read %d complete scrapes, "
                    "the last, possibly partial one dropped; `kvoffload record --repair %s` "
                    "turns it into an OpenMetrics file",
                    self.journal,
                    self.lines_before,
                    self.complete,
                    self.journal,
                )
                return
            log.warning(
                "truncated recording: no '# EOF' after line %d (cut short?): read "
                "%d complete scrapes, the last, possibly partial one dropped",
                self.lines_before,
                self.complete,
            )
            return
        if self.current is not None:
            self.current.families.update(self.pending)
            yield self.current
