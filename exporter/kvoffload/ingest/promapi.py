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


@dataclass
class Series:
    """One series of a range query: its labels (with `__name__`) and its points in time order."""

    labels: dict[str, str]
    times: list[float]
    values: list[float]


@dataclass
class RangeResult:
    series: list[Series]
    # What the server said besides the data: partial answers (Thanos), dropped points, ...
    warnings: list[str] = field(default_factory=list)


class PrometheusAPI:
    def __init__(self, url: str, auth: PromAuth | None = None, timeout: float = 60.0) -> None:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise PromAPIError(f"{url}: not an http(s) URL")
        # Accept both the server's root (…:9090, …/prometheus) and its API root (…/api/v1).
        self.base = url[: -len("/api/v1")] if url.endswith("/api/v1") else url
        self.timeout = timeout
        auth = auth or PromAuth()
        self.session = requests.Session()
        self.session.headers["Accept-Encoding"] = "gzip"
        self.session.headers.update(dict(auth.headers))
        if auth.bearer_token:
            self.session.headers["Authorization"] = f"Bearer {auth.bearer_token}"
        elif auth.username is not None:
            self.session.auth = (auth.username, auth.password or "")
        self.session.verify = False if auth.insecure_skip_verify else (auth.ca_file or True)
        if auth.cert_file:
            self.session.cert = (auth.cert_file, auth.key_file) if auth.key_file else auth.cert_file

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
        data, warnings = self._get("/api/v1/query", {"query": expr, "time": _ts(time)})
        return RangeResult(self._series(data, expr, ("matrix", "vector")), warnings)

    def query_range(self, expr: str, start: float, end: float, step: float) -> RangeResult:
        data, warnings = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)},
        )
        return RangeResult(self._series(data, expr, ("matrix",)), warnings)

    def _series(self, data: Any, expr: str, kinds: tuple[str, ...]) -> list[Series]:
        kind = data.get("resultType") if isinstance(data, dict) else None
        if kind not in kinds:
            raise PromAPIError(f"{self.base}: answered {kind or 'nothing'} for {expr}")
        out: list[Series] = []
        for item in data.get("result") or []:
            labels = item.get("metric") if isinstance(item, dict) else None
            # Float samples only ("histograms", Prometheus 3's native ones, are not vLLM's).
            points = (item.get("values") or []) if kind == "matrix" else [item.get("value")]
            if not isinstance(labels, dict) or not isinstance(points, list):
                raise PromAPIError(f"{self.base}: a series without metric/values for {expr}")
            try:
                times = [float(p[0]) for p in points]
                values = [float(p[1]) for p in points]
            except (TypeError, ValueError, IndexError):
                raise PromAPIError(f"{self.base}: a point is not [time, value] in {expr}") from None
            out.append(Series(labels, times, values))
        return out

    # -- transport --------------------------------------------------------------------------
    def _get(self, path: str, params: dict[str, str]) -> tuple[Any, list[str]]:
        url = self.base + path
        what = f"{self.base}{path}"
        try:
            # POST with a form body, like Grafana: long selectors (many instances) do not fit in
            # a URL; every server of this API accepts it for these endpoints.
            resp = self.session.post(url, data=params, timeout=self.timeout)
        except requests.Timeout:
            raise PromAPIError(f"{what}: no answer within {self.timeout:g} s") from None
        except requests.exceptions.SSLError as exc:
            raise PromAPIError(f"{what}: TLS: {_first_line(exc)}") from None
        except requests.RequestException as exc:
            raise PromAPIError(f"{what}: {_first_line(exc)}") from None
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
