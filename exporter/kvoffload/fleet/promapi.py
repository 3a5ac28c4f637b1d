"""A small client of the Prometheus HTTP API (`/api/v1`), for `analyze --prometheus`.

It is synchronous (`requests`) on purpose: the fleet reader asks one question at a time. Every
failure is a one-line `PromAPIError`. What a hostile server may cost is bounded (docs/exporter.md,
"What a Prometheus may answer").
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError as URLLib3Error
from urllib3.exceptions import TimeoutError as URLLib3Timeout

from kvoffload.errors import InputError


class PromAPIError(InputError):
    """A question to the Prometheus API got no usable answer."""


class PromStopped(PromAPIError):
    """The client was stopped (`PrometheusAPI.abort`) while or before asking."""


MIB = 1024 * 1024


@dataclass(frozen=True)
class PromLimits:
    """What one answer may cost.

    Why: the reader asks for about `fleet.source.POINT_BUDGET` points a question. These limits leave
    room for a plan that was off and stop a server that answers far more."""

    max_answer_bytes: int = 128 * MIB  # on the wire and once inflated
    max_points: int = 1_000_000  # points and series (or label sets) in one answer
    max_error_bytes: int = 64 * 1024  # of a body that is not a success: its message is read


def printable(text: object, limit: int = 300) -> str:
    """Server text made safe for a terminal or a log, cut to `limit` characters.

    Control and other unprintable characters (ESC, CR, bidi overrides…) are escaped as `\\x1b`."""
    value = str(text)
    if len(value) > limit:
        value = value[:limit] + "…"
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in value)


@dataclass(frozen=True)
class PromAuth:
    """How to reach a protected Prometheus: the options of `analyze --prometheus`."""

    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None  # verify the server against this CA bundle
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()  # e.g. X-Scope-OrgID for Mimir/Cortex tenants


class Series(msgspec.Struct):
    """One series of an answer: its labels (with `__name__`) and its (time, value) points in time
    order.

    Decoded straight from the JSON by msgspec, since reading a fleet's millions of points costs most
    here."""

    metric: dict[str, str]
    values: list[tuple[float, float]] = []
    value: tuple[float, float] | None = None  # an instant vector's one point

    @property
    def labels(self) -> dict[str, str]:
        return self.metric

    @property
    def points(self) -> list[tuple[float, float]]:
        return self.values if self.value is None else [self.value]


class _Data(msgspec.Struct):
    resultType: str  # the API's name
    result: list[Series]


class _Answer(msgspec.Struct):
    """A query's answer; the other keys (errors, Prometheus 3's `infos`) are read apart."""

    status: str
    data: _Data | None = None
    warnings: list[str] = []


@dataclass
class RangeResult:
    series: list[Series]
    # What the server said besides the data: partial answers (Thanos), dropped points, ...
    warnings: list[str] = field(default_factory=list)


_TIMEOUTS = (requests.Timeout, URLLib3Timeout, TimeoutError)


class _Watch:
    """The sockets one question uses, shut down by `fire` (deadline passed, or client stopped).

    A blocked read then returns at once, whatever the server dribbles."""

    _current = threading.local()

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.fired: str | None = None
        self.lock = threading.Lock()

    @classmethod
    def add(cls, sock: socket.socket | None) -> None:
        watch: _Watch | None = getattr(cls._current, "watch", None)
        if watch is None or sock is None:
            return
        with watch.lock:
            watch.sockets.append(sock)
            fired = watch.fired
        if fired is not None:
            _shut(sock)

    def fire(self, why: str) -> None:
        with self.lock:
            if self.fired is None:
                self.fired = why
            sockets = list(self.sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTP(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _Watch.add(sock)  # before TLS: a handshake that dribbles is cut short too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _Watch.add(self.sock)  # a kept-alive connection asked again
        super().request(*args, **kwargs)


class _WatchedHTTPS(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _Watch.add(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _Watch.add(self.sock)
        super().request(*args, **kwargs)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTP


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPS


_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _Adapter(HTTPAdapter):
    """requests' adapter whose connections report their sockets to the question's watch."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


class _Session(requests.Session):
    """A session that drops the operator's `--header` values on a redirect to another host.

    A tenant or an API key must not leak, just as requests drops Authorization there."""

    def __init__(self, private_headers: tuple[str, ...]) -> None:
        super().__init__()
        self.private_headers = private_headers
        self.max_redirects = 5
        self.hooks["response"].append(_skip_redirect_body)

    def rebuild_auth(self, prepared_request: Any, response: Any) -> None:
        super().rebuild_auth(prepared_request, response)
        if self.should_strip_auth(response.request.url, prepared_request.url):
            for name in self.private_headers:
                prepared_request.headers.pop(name, None)


def _skip_redirect_body(resp: requests.Response, **_kwargs: Any) -> None:
    """Skip a redirect's body, closing the connection instead of reusing it.

    By default requests reads the whole body before following, without a bound."""
    if resp.is_redirect:
        resp.raw.close()
        resp._content = b""


@dataclass(frozen=True)
class _Reply:
    status: int
    reason: str
    body: bytes
    truncated: bool  # an error body read only as far as its first max_error_bytes


# Prometheus 2.x and 3.x, Thanos Query, Mimir/Cortex (their `/prometheus` prefix is part of the
# URL given), VictoriaMetrics. One question at a time, so a keep-alive session is all it needs.
class PrometheusAPI:
    def __init__(
        self,
        url: str,
        auth: PromAuth | None = None,
        timeout: float = 60.0,
        gzip: bool = False,
        limits: PromLimits | None = None,
    ) -> None:
        self.auth = auth or PromAuth()
        self.limits = limits or PromLimits()
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise PromAPIError(f"{printable(url)}: not an http(s) URL")
        # Accept both the server's root (…:9090, …/prometheus) and its API root (…/api/v1).
        self.base = url[: -len("/api/v1")] if url.endswith("/api/v1") else url
        # The whole question (connect, send, every byte of the answer) within this; each read
        # waits at most as long.
        self.timeout = timeout
        # Uncompressed by default: gzipping a fleet's answers cost Prometheus 45 of its 56 CPU
        # seconds in the 1,000-engine benchmark (docs/performance.md); worth it only over a
        # slow link.
        self.gzip = gzip
        self._stopped = False
        self._watches: set[_Watch] = set()
        self._watches_lock = threading.Lock()
        self.session = self._session()

    def _session(self) -> requests.Session:
        auth = self.auth
        session = _Session(tuple(name for name, _value in auth.headers))
        adapter = _Adapter()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["Accept-Encoding"] = "gzip" if self.gzip else "identity"
        session.headers.update(dict(auth.headers))
        if auth.bearer_token:
            session.headers["Authorization"] = f"Bearer {auth.bearer_token}"
        elif auth.username is not None:
            session.auth = (auth.username, auth.password or "")
        # Given with each request too: requests lets REQUESTS_CA_BUNDLE override a session's.
        self._verify: bool | str = False if auth.insecure_skip_verify else (auth.ca_file or True)
        session.verify = self._verify
        if auth.cert_file:
            session.cert = (auth.cert_file, auth.key_file) if auth.key_file else auth.cert_file
        return session

    def reopen(self) -> None:
        """Allow questions again after `abort`, on a session of its own.

        A forked worker must not share its parent's sockets."""
        self.session = self._session()
        self._stopped = False
        self._watches = set()
        self._watches_lock = threading.Lock()

    def close(self) -> None:
        self.session.close()

    def abort(self) -> None:
        """Stop: the question being asked (from any thread) ends at once with `PromStopped`,
        and so does every later one."""
        self._stopped = True
        with self._watches_lock:
            watches = list(self._watches)
        for watch in watches:
            watch.fire("stopped")

    # -- questions --------------------------------------------------------------------------
    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        data, _warnings = self._get(
            f"/api/v1/label/{label}/values",
            {"match[]": match, "start": _ts(start), "end": _ts(end)},
        )
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise PromAPIError(f"{self.base}: label values of {label}: not a list of strings")
        return data

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        data, _warnings = self._get(
            "/api/v1/series", {"match[]": match, "start": _ts(start), "end": _ts(end)}
        )
        if not isinstance(data, list) or not all(
            isinstance(v, dict) and all(isinstance(x, str) for x in v.values()) for v in data
        ):
            raise PromAPIError(f"{self.base}: series of {match}: not a list of label sets")
        return data

    def query_instant(self, expr: str, time: float) -> RangeResult:
        """An instant query. A range selector's answer (a matrix) keeps every raw sample,
        an instant vector's each series' one point."""
        return self._query(
            "/api/v1/query", {"query": expr, "time": _ts(time)}, ("matrix", "vector")
        )

    def query_range(self, expr: str, start: float, end: float, step: float) -> RangeResult:
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)}
        return self._query("/api/v1/query_range", params, ("matrix",))

    def _query(self, path: str, params: dict[str, str], kinds: tuple[str, ...]) -> RangeResult:
        reply = self._post(path, params)
        what = self._what(path, params)
        if reply.status == 200 and not reply.truncated:
            answer = self._decode_query(reply.body, what)
            if answer is not None and answer.status == "success" and answer.data is not None:
                if answer.data.resultType not in kinds:
                    kind = printable(answer.data.resultType, 40)
                    raise PromAPIError(f"{what}: answered {kind}, not {' or '.join(kinds)}")
                return RangeResult(answer.data.result, self._notes(answer.warnings))
        self._answer(reply, what)  # raises with the server's reason
        raise PromAPIError(f"{what}: an answer that is not a query result")

    def _decode_query(self, body: bytes, what: str) -> _Answer | None:
        # Counted before decoding, in one pass: each point, and each series' list of them,
        # opens a `[`; a decoded point costs some 100 bytes, its JSON some 25.
        self._check_points(body.count(b"["), what)
        # Prometheus writes +Inf as "+Inf", which msgspec's lax float does not read ("Inf"
        # it does); only a point's value sits between `,` and `]`.
        body = body.replace(b',"+Inf"]', b',"Inf"]')
        try:
            return msgspec.json.decode(body, type=_Answer, strict=False)
        except msgspec.DecodeError:
            return None

    def _check_points(self, points: int, what: str) -> None:
        if points > self.limits.max_points:
            raise PromAPIError(
                f"{what}: the answer holds more than {self.limits.max_points:,} points "
                "(the most one answer may hold)"
            )

    def _notes(self, warnings: list[Any]) -> list[str]:
        # All of them (the body's limit bounds their number): the reader counts each distinct one.
        return [printable(w) for w in warnings]

    # -- transport --------------------------------------------------------------------------
    def _what(self, path: str, params: dict[str, str]) -> str:
        """The question, for its errors: the endpoint and the start of what was asked."""
        asked = params.get("query") or params.get("match[]") or ""
        if len(asked) > 120:  # its start (the names) and its end (the instances, the range)
            asked = asked[:40] + "…" + asked[-70:]
        return f"{self.base}{path}" + (f" ({printable(asked, 120)})" if asked else "")

    def _get(self, path: str, params: dict[str, str]) -> tuple[Any, list[str]]:
        what = self._what(path, params)
        reply = self._post(path, params)
        if reply.status == 200 and not reply.truncated:
            self._check_points(reply.body.count(b"{"), what)  # label sets, for /series
        return self._answer(reply, what)

    def _post(self, path: str, params: dict[str, str]) -> _Reply:
        what = self._what(path, params)
        if self._stopped:
            raise PromStopped(f"{what}: stopped")
        watch = _Watch()
        deadline = time.monotonic() + self.timeout
        timer = threading.Timer(self.timeout, watch.fire, ("deadline",))
        timer.daemon = True
        with self._watches_lock:
            self._watches.add(watch)
        _Watch._current.watch = watch
        timer.start()
        try:
            return self._exchange(path, params, deadline, watch)
        except (requests.RequestException, URLLib3Error, OSError, zlib.error) as exc:
            if watch.fired == "stopped":
                raise PromStopped(f"{what}: stopped") from None
            if watch.fired == "deadline" or isinstance(
                exc, requests.Timeout | URLLib3Timeout | TimeoutError
            ):
                raise self._late(what) from None
            if isinstance(exc, requests.exceptions.SSLError):
                raise PromAPIError(f"{what}: TLS: {_first_line(exc)}") from None
            raise PromAPIError(f"{what}: {_first_line(exc)}") from None
        finally:
            timer.cancel()
            _Watch._current.watch = None
            with self._watches_lock:
                self._watches.discard(watch)

    def _late(self, what: str) -> PromAPIError:
        return PromAPIError(f"{what}: no complete answer within {self.timeout:g} s")

    def _exchange(
        self, path: str, params: dict[str, str], deadline: float, watch: _Watch
    ) -> _Reply:
        what = self._what(path, params)
        # POST with a form body, like Grafana: long selectors (many instances) do not fit in
        # a URL; every server of this API accepts it for these endpoints. Streamed: the body
        # is read here, within its limits.
        resp = self.session.post(
            self.base + path,
            data=params,
            timeout=self.timeout,
            verify=self._verify,
            stream=True,
        )
        try:
            limit = self.limits.max_answer_bytes
            if resp.status_code != 200:
                limit = min(limit, self.limits.max_error_bytes)
            whole = resp.status_code == 200
            body, truncated = self._read(resp, what, limit, whole, deadline, watch)
        finally:
            resp.close()  # a connection whose answer was not read to its end is not reused
        return _Reply(resp.status_code, resp.reason or "", body, truncated)

    def _read(
        self,
        resp: requests.Response,
        what: str,
        limit: int,
        whole: bool,
        deadline: float,
        watch: _Watch,
    ) -> tuple[bytes, bool]:
        """The body, inflated, at most `limit` bytes both on the wire and inflated.

        Past the limit: an error if the whole body is needed (`whole`), else what was read."""
        inflater = _inflater(resp.headers.get("Content-Encoding", ""), what)
        parts: list[bytes] = []
        size = wire = 0  # bytes inflated, bytes received
        # Large reads: each costs a few Python calls, and a fleet's answers are megabytes.
        step = min(limit + 1, MIB)
        while size <= limit and wire <= limit:
            chunk = resp.raw.read(step, decode_content=False)
            if watch.fired is not None or time.monotonic() > deadline:
                raise requests.Timeout
            if not chunk:
                return b"".join(parts), False
            wire += len(chunk)
            if inflater is None:
                parts.append(chunk)
                size += len(chunk)
                continue
            data = inflater.decompress(chunk, limit + 1 - size)
            while True:  # never more than the limit inflated at once
                parts.append(data)
                size += len(data)
                if not inflater.unconsumed_tail or size > limit:
                    break
                data = inflater.decompress(inflater.unconsumed_tail, limit + 1 - size)
        if not whole:
            return b"".join(parts)[:limit], True
        raise PromAPIError(
            f"{what}: an answer larger than {limit / MIB:g} MiB"
            + (" once inflated" if size > limit and inflater is not None else "")
            + " (the most one answer may hold)"
        )

    def _answer(self, reply: _Reply, what: str) -> tuple[Any, list[str]]:
        try:
            body = msgspec.json.decode(reply.body)
        except msgspec.DecodeError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            reason = f"HTTP {reply.status}" + (
                f" {printable(reply.reason, 80)}" if reply.reason else ""
            )
            text = reply.body.decode("utf-8", "replace").strip()
            hint = printable(text.splitlines()[0], 200) if text else ""
            raise PromAPIError(
                f"{what}: {reason}: not the Prometheus API's JSON" + (f" ({hint})" if hint else "")
            )
        if body["status"] != "success":
            kind = printable(body.get("errorType") or f"HTTP {reply.status}", 80)
            raise PromAPIError(
                f"{what}: {kind}: {printable(body.get('error') or 'no error message')}"
            )
        # Prometheus 3 puts notes that are not warnings under "infos".
        notes = body.get("warnings") or []
        return body.get("data"), self._notes(notes if isinstance(notes, list) else [notes])


def _inflater(encoding: str, what: str) -> Any:
    """A gzip or deflate decompressor for the answer's Content-Encoding (None: identity)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise PromAPIError(f"{what}: encoded {printable(encoding, 40)}, which was not asked for")


def _ts(value: float) -> str:
    return f"{value:.3f}"


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return printable(text.splitlines()[0] if text.strip() else text, 300)
