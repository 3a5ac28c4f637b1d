"""`--web.config.file`: TLS and basic auth in the format of Prometheus' exporter-toolkit.

One file then serves every exporter of a node, re-read on change without a restart.
The format, the reload rules and what is refused: docs/exporter.md ("TLS and basic auth")."""

from __future__ import annotations

import base64
import binascii
import logging
import os
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from kvoffload import logrepeat
from kvoffload.cli.passwords import PasswordChecks, Verdict
from kvoffload.errors import InputError

log = logging.getLogger(__name__)
# A file rewritten in place fails to load many times over: the same error once a minute.
log.addFilter(logrepeat.RepeatFilter(60.0))
RETRY_SECONDS = 1.0  # a file that did not load is read again this often, changed or not

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Python's TLS verifies every client certificate it asks for: it cannot take one unverified,
# which exporter-toolkit's RequestClientCert and RequireAnyClientCert do.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# exporter-toolkit's keys that name Go's own cipher and curve identifiers, or inline PEM.
_UNSUPPORTED_TLS = ("cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key")
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    *_UNSUPPORTED_TLS,
}
# The response headers exporter-toolkit lets a web config set.
_HEADERS = {
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
}
# Kubelet probes carry no credentials and these say only "alive"/"ready": left open so a pod
# with basic auth keeps its probes (a client certificate is asked at the handshake, for all).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# A user that does not exist costs a bcrypt check all the same (no timing oracle of names),
# against this salt and digest at the users' cost (`dummy_hash`); no known password matches.
_DUMMY_TAIL = b"03NEP5N9GSBbfSK5lK9GluiYD0TBeQxr5tdhLnF9d9hySB2lhP0Rq"


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    # `basic_auth_users` given as a mapping, `{}` included (not absent, not left empty).
    users_given: bool = False

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)

    def dummy_hash(self) -> bytes:
        """A hash no password matches, at the highest cost common among users' hashes.

        An unknown name then takes as long as a known one."""
        costs = Counter(int(h[4:6]) for h in self.users.values())
        cost = max(costs, key=lambda c: (costs[c], c)) if costs else 10
        return b"$2b$%02d$" % cost + _DUMMY_TAIL


def _mapping(path: str, where: str, value: object, known: set[str] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{path}: {where} must be a mapping")
    unknown = sorted(str(k) for k in value if known is not None and k not in known)
    if unknown:
        raise InputError(f"{path}: unknown field(s) in {where}: {', '.join(unknown)}")
    return value


def _version(path: str, key: str, value: object) -> ssl.TLSVersion:
    if value not in _VERSIONS:
        raise InputError(f"{path}: tls_server_config.{key} {value!r}: use one of {list(_VERSIONS)}")
    return _VERSIONS[str(value)]


def parse_web_config(path: str) -> WebConfig:
    """The configuration in `path`; InputError (one line) for anything exporter-toolkit
    would refuse or kvoffload cannot do."""
    top = _mapping(
        path,
        "the file",
        _load_yaml(path),
        {"tls_server_config", "http_server_config", "basic_auth_users"},
    )
    tls = _mapping(path, "tls_server_config", top.get("tls_server_config"), _TLS_KEYS)
    cert, key, ca = _tls_files(path, tls)
    client_auth = _client_auth(path, tls.get("client_auth_type") or "NoClientCert", ca)
    http = _mapping(path, "http_server_config", top.get("http_server_config"), {"http2", "headers"})
    headers = _headers(path, http.get("headers"))
    users = _bcrypt_users(path, top.get("basic_auth_users"))
    return WebConfig(
        cert,
        key,
        ca,
        client_auth,
        _version(path, "min_version", tls.get("min_version", "TLS12")),
        _version(path, "max_version", tls["max_version"]) if "max_version" in tls else None,
        users,
        headers,
        isinstance(top.get("basic_auth_users"), dict),
    )


def _load_yaml(path: str) -> object:
    """The file's YAML document; InputError if it cannot be read or parsed.

    Why: the flag's name and the first line of the parser's message say what to fix.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except OSError as exc:
        raise InputError(f"--web.config.file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None


def _tls_files(path: str, tls: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """The certificate, key and client CA files of tls_server_config, relative to `path`.

    Why: exporter-toolkit resolves them next to the config file, and a half TLS setup is refused.
    """
    unsupported = [k for k in _UNSUPPORTED_TLS if k in tls]
    if unsupported:
        raise InputError(
            f"{path}: tls_server_config.{unsupported[0]} is not supported by kvoffload "
            "(Python's TLS: give cert_file/key_file, OpenSSL's default ciphers and curves)"
        )
    base = os.path.dirname(os.path.abspath(path))

    def local(key: str) -> str | None:
        value = tls.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: tls_server_config.{key} must be a file name")
        return os.path.join(base, value)

    cert, key, ca = local("cert_file"), local("key_file"), local("client_ca_file")
    if tls and (cert is None or key is None):
        raise InputError(f"{path}: tls_server_config needs both cert_file and key_file")
    return cert, key, ca


def _client_auth(path: str, auth_type: str, ca: str | None) -> ssl.VerifyMode:
    """The client certificate check client_auth_type names, consistent with client_ca_file.

    Why: Python's TLS verifies every certificate it asks for, so two of Go's modes cannot be kept.
    """
    if auth_type in _UNSUPPORTED_AUTH:
        raise InputError(
            f"{path}: client_auth_type {auth_type} is not supported (Python's TLS verifies "
            "every client certificate): use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
        )
    if auth_type not in _CLIENT_AUTH:
        raise InputError(f"{path}: client_auth_type {auth_type!r}: use one of {list(_CLIENT_AUTH)}")
    client_auth = _CLIENT_AUTH[auth_type]
    if ca is not None and client_auth == ssl.CERT_NONE:
        raise InputError(f"{path}: client_ca_file is set but client_auth_type is NoClientCert")
    if ca is None and client_auth != ssl.CERT_NONE:
        raise InputError(f"{path}: client_auth_type {auth_type} needs client_ca_file")
    return client_auth


def _headers(path: str, value: object) -> dict[str, str]:
    """The response headers http_server_config.headers sets, only those exporter-toolkit allows.

    Why: one file serves every exporter of the node, so it means here what it means there.
    """
    headers = {str(k): str(v) for k, v in _mapping(path, "headers", value, None).items()}
    refused = sorted(set(headers) - _HEADERS)
    if refused:
        raise InputError(
            f"{path}: header {refused[0]} cannot be set (allowed: {', '.join(sorted(_HEADERS))})"
        )
    return headers


def _bcrypt_users(path: str, value: object) -> dict[str, bytes]:
    """basic_auth_users: each name's bcrypt hash, checked for form and cost.

    Why: a hash that is not bcrypt would fail every login, so it is refused at load.
    """
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(path, "basic_auth_users", value, None).items():
        raw = str(hashed).encode()
        if (
            not raw.startswith((b"$2a$", b"$2b$", b"$2y$"))
            or len(raw) != 60
            or raw[6:7] != b"$"
            or not raw[4:6].isdigit()
            or not 4 <= int(raw[4:6]) <= 31
        ):
            raise InputError(f"{path}: basic_auth_users.{user} is not a bcrypt hash")
        users[str(user)] = raw
    return users


def tls_context(config: WebConfig) -> ssl.SSLContext:
    assert config.cert_file is not None and config.key_file is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = config.min_version
    if config.max_version is not None:
        ctx.maximum_version = config.max_version
    try:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    except OSError as exc:
        raise InputError(
            f"TLS certificate {config.cert_file} / key {config.key_file}: "
            f"{exc.strerror or getattr(exc, 'reason', None) or exc}"
        ) from None
    if config.client_ca_file is not None:
        try:
            ctx.load_verify_locations(config.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(
                f"client_ca_file {config.client_ca_file}: "
                f"{exc.strerror or getattr(exc, 'reason', None) or exc}"
            ) from None
    ctx.verify_mode = config.client_auth
    return ctx


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows links: a Kubernetes secret volume swaps ..data
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class WebSecurity:
    """The web configuration in force for one server: a TLS context and a basic-auth/headers
    middleware.

    Both follow changes to the files."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.config = parse_web_config(path) if path else WebConfig()
        self._context = tls_context(self.config) if self.config.tls else None
        self._stamp = self._files_stamp()
        self._retry_at: float | None = None  # set while the files on disk did not load
        self.passwords = PasswordChecks()
        self._dummy = self.config.dummy_hash()

    def _files_stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        return _stamp(((self.path,) if self.path else ()) + self.config.files())

    @property
    def scheme(self) -> str:
        return "https" if self._context is not None else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's context; each handshake first re-reads what changed.

        The handshake then runs on the newest context that loaded (OpenSSL allows the swap in the
        ClientHello callback)."""
        if self._context is None:
            return None
        self._context.sni_callback = self._on_hello
        return self._context

    def _on_hello(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        self.refresh()
        if self._context is not None and conn.context is not self._context:
            conn.context = self._context

    def refresh(self) -> None:
        if self.path is None:
            return
        stamp = self._files_stamp()
        # Read again when a file changed, and now and then while the last read failed: a
        # file rewritten twice within the clock's tick at one size would look unchanged.
        retry = self._retry_at is not None and time.monotonic() >= self._retry_at
        if stamp == self._stamp and not retry:
            return
        self._stamp = stamp
        self._retry_at = time.monotonic() + RETRY_SECONDS
        try:
            config = parse_web_config(self.path)
            context = tls_context(config) if config.tls else None
        except InputError as exc:
            log.error("web config not reloaded, the last good one stays: %s", exc)
            return
        if (context is None) != (self._context is None):
            log.error("web config not reloaded: turning TLS on or off needs a restart")
            return
        if self.config.users and not config.users_given:
            # An empty or half-written file must not let everyone in.
            log.error(
                "web config %s not reloaded: it names no basic_auth_users (empty or partly "
                "written?), the last good users stay; 'basic_auth_users: {}' turns auth off",
                self.path,
            )
            return
        self._retry_at = None
        if config.users != self.config.users:
            self.passwords.forget()
        self.config, self._context = config, context
        self._dummy = config.dummy_hash()
        self._stamp = self._files_stamp()  # the new config may name other files
        log.info("web config %s reloaded", self.path)

    async def _authorized(self, header: str | None) -> Verdict:
        users = self.config.users
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return Verdict.BAD
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Verdict.BAD
        hashed = users.get(user)
        known = hashed is not None and bool(sep)
        return await self.passwords.check(
            user, password.encode(), hashed or self._dummy, known=known
        )

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.refresh()
        config = self.config
        response: web.StreamResponse
        verdict = Verdict.OK
        if config.users and request.path not in OPEN_PATHS:
            verdict = await self._authorized(request.headers.get("Authorization"))
        if verdict is Verdict.OK:
            response = await handler(request)
        elif verdict is Verdict.BUSY:  # too many passwords being checked: try again later
            response = web.Response(
                status=503, text="Too many password checks, retry\n", headers={"Retry-After": "1"}
            )
        else:
            response = web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="kvoffload"'},
            )
        response.headers.update(config.headers)
        return response

    def install(self, app: web.Application) -> web.Application:
        app.middlewares.append(self.middleware)
        return app
