"""A small client of the Prometheus HTTP API (`/api/v1`), for `analyze --prometheus`.

It speaks to whatever serves that API: Prometheus 2.x and 3.x, Thanos Query, Mimir/Cortex
(their `/prometheus` prefix is part of the URL given), VictoriaMetrics. Synchronous on purpose
(`requests`): the fleet reader asks one question at a time and works on the answer, so there
is nothing to overlap but the download, and a plain session with keep-alive is the simplest
thing that does that.

Every failure becomes a `PromAPIError`, one line naming what was asked and what went wrong
(HTTP status, the API's `errorType: error`, a timeout, a body that is not the API's JSON);
the caller decides whether it fails the run or only the engines the question was about.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
import requests

from kvoffload.errors import InputError


class PromAPIError(InputError):
    """A question to the Prometheus API got no usable answer."""


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
    """One series of an answer: its labels (with `__name__`) and its (time, value) points in
    time order. Decoded straight from the JSON by msgspec (values arrive as strings): a
    fleet's answer holds millions of points, and this is where reading it costs."""

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


class PrometheusAPI:
    def __init__(
        self, url: str, auth: PromAuth | None = None, timeout: float = 60.0, gzip: bool = False
    ) -> None:
        self.auth = auth or PromAuth()
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise PromAPIError(f"{url}: not an http(s) URL")
        # Accept both the server's root (…:9090, …/prometheus) and its API root (…/api/v1).
        self.base = url[: -len("/api/v1")] if url.endswith("/api/v1") else url
        self.timeout = timeout
        # Uncompressed by default: gzipping a fleet's answers cost Prometheus 45 of its 56 CPU
        # seconds in the 1,000-engine benchmark (docs/performance.md); worth it only over a
        # slow link.
        self.gzip = gzip
        self.session = self._session()

    def _session(self) -> requests.Session:
        auth = self.auth
        session = requests.Session()
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
        """A session of its own (a forked worker must not share its parent's sockets)."""
        self.session = self._session()

    def close(self) -> None:
        self.session.close()

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
        if not isinstance(data, list) or not all(isinstance(v, dict) for v in data):
            raise PromAPIError(f"{self.base}: series of {match}: not a list of label sets")
        return data

    def query_instant(self, expr: str, time: float) -> RangeResult:
        """An instant query; a range selector's answer (a matrix) keeps every raw sample, an
        instant vector's each series' one point."""
        return self._query(
            "/api/v1/query", {"query": expr, "time": _ts(time)}, ("matrix", "vector")
        )

    def query_range(self, expr: str, start: float, end: float, step: float) -> RangeResult:
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)}
        return self._query("/api/v1/query_range", params, ("matrix",))

    def _query(self, path: str, params: dict[str, str], kinds: tuple[str, ...]) -> RangeResult:
        resp = self._post(path, params)
        expr = params["query"]
        if resp.status_code == 200:
            # Prometheus writes +Inf as "+Inf", which msgspec's lax float does not read ("Inf"
            # it does); only a point's value sits between `,` and `]`.
            body = resp.content.replace(b',"+Inf"]', b',"Inf"]')
            try:
                answer = msgspec.json.decode(body, type=_Answer, strict=False)
            except msgspec.DecodeError:
                answer = None
            if answer is not None and answer.status == "success" and answer.data is not None:
                if answer.data.resultType not in kinds:
                    raise PromAPIError(f"{self.base}: answered {answer.data.resultType} for {expr}")
                return RangeResult(answer.data.result, answer.warnings)
        self._answer(resp, path)  # raises with the server's reason
        raise PromAPIError(f"{self.base}{path}: an answer that is not a query result for {expr}")

    # -- transport --------------------------------------------------------------------------
    def _get(self, path: str, params: dict[str, str]) -> tuple[Any, list[str]]:
        return self._answer(self._post(path, params), path)

    def _post(self, path: str, params: dict[str, str]) -> requests.Response:
        url = self.base + path
        what = f"{self.base}{path}"
        try:
            # POST with a form body, like Grafana: long selectors (many instances) do not fit in
            # a URL; every server of this API accepts it for these endpoints.
            resp = self.session.post(url, data=params, timeout=self.timeout, verify=self._verify)
        except requests.Timeout:
            raise PromAPIError(f"{what}: no answer within {self.timeout:g} s") from None
        except requests.exceptions.SSLError as exc:
            raise PromAPIError(f"{what}: TLS: {_first_line(exc)}") from None
        except requests.RequestException as exc:
            raise PromAPIError(f"{what}: {_first_line(exc)}") from None
        return resp

    def _answer(self, resp: requests.Response, path: str) -> tuple[Any, list[str]]:
        what = f"{self.base}{path}"
        try:
            body = resp.json()
        except (json.JSONDecodeError, ValueError):
            body = None
        if not isinstance(body, dict) or "status" not in body:
            reason = f"HTTP {resp.status_code}" + (f" {resp.reason}" if resp.reason else "")
            hint = resp.text.strip().splitlines()[0][:200] if resp.text.strip() else ""
            raise PromAPIError(
                f"{what}: {reason}: not the Prometheus API's JSON" + (f" ({hint})" if hint else "")
            )
        if body["status"] != "success":
            kind = body.get("errorType") or f"HTTP {resp.status_code}"
            raise PromAPIError(f"{what}: {kind}: {body.get('error') or 'no error message'}")
        # Prometheus 3 puts notes that are not warnings under "infos".
        notes = [str(w) for w in (body.get("warnings") or [])]
        return body.get("data"), notes


def _ts(value: float) -> str:
    return f"{value:.3f}"


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
