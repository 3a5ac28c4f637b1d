"""The command-line conventions of a Prometheus exporter, for every `kvoffload` subcommand.

`--log.*` go before or after the subcommand, and every flag has a `KVOFFLOAD_*` variable.
The commands that listen get `--web.*`, and exit 2 in one line when the address is taken."""

from __future__ import annotations

import datetime as dt
import errno
import functools
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kvoffload import logrepeat
from kvoffload.errors import InputError

# Outside 9100-9999: the Prometheus wiki's "Default port allocations" has no free port left
# there, and 9400 (the old default) is dcgm-exporter's, the likeliest neighbour on a GPU node.
# 19400 is on no list of exporter ports, below the NodePort (30000-32767) and Linux ephemeral
# (32768-60999) ranges, and clear of vLLM (8000), kubelet (10250) and node-exporter (9100).
DEFAULT_PORT = 19400
ENV_PREFIX = "KVOFFLOAD"
ENV_HELP = (
    "Every flag also reads the environment, scoped to its command: --duration of `record` "
    "from KVOFFLOAD_RECORD_DURATION (the flag's name in capitals, dots and dashes as "
    "underscores; the command line wins). The --web.*, --log.* and --memory-limit flags also "
    "read the unscoped name (KVOFFLOAD_WEB_LISTEN_ADDRESS, KVOFFLOAD_MEMORY_LIMIT) after the "
    "scoped one. Repeatable flags take a whitespace-separated list (--header: one per line). "
    "--log.level and --log.format go before or after the subcommand (KVOFFLOAD_LOG_LEVEL, "
    "KVOFFLOAD_LOG_FORMAT)."
)
# Flags that mean the same to every command that has them (the exporter conventions and the
# vLLM container's memory): KVOFFLOAD_<FLAG> is read too, after KVOFFLOAD_<COMMAND>_<FLAG>.
# Every other flag reads only its command's variable: a KVOFFLOAD_DURATION meant for `record`
# changed `sim` and `analyze` too.
SHARED_FLAGS = frozenset(
    {
        "--log.level",
        "--log.format",
        "--memory-limit",
        "--web.listen-address",
        "--web.telemetry-path",
        "--web.config.file",
    }
)
# Repeatable flags whose values contain spaces: one value per line in the environment.
_LINE_LISTS = {"--header"}

LOG_LEVELS = ("debug", "info", "warn", "error")
_LEVEL_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
    logging.CRITICAL: "error",
}


def _record_fields(record: logging.LogRecord) -> dict[str, str]:
    ts = dt.datetime.fromtimestamp(record.created, dt.UTC)
    fields = {
        "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": _LEVEL_NAMES.get(record.levelno, record.levelname.lower()),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info:
        fields["err"] = logging.Formatter().formatException(record.exc_info)
    return fields


class LogfmtFormatter(logging.Formatter):
    """`ts=… level=info logger=… msg="…"`: the line format of Prometheus' own components."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _record_fields(record).items())


def _logfmt_value(value: str) -> str:
    if value and not any(c in value for c in ' ="\\\n\t') and value.isprintable():
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_record_fields(record), ensure_ascii=False)


_FORMATTERS: dict[str, type[logging.Formatter]] = {
    "logfmt": LogfmtFormatter,
    "json": JSONFormatter,
}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


_handler: _StderrHandler | None = None


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Set the level and/or the format of kvoffload's log lines (stderr)."""
    global _handler
    root = logging.getLogger()
    if _handler is None:
        _handler = _StderrHandler()
        _handler.setFormatter(LogfmtFormatter())
        root.addHandler(_handler)
        # On our handler only: another one on the root (a host program's, a test runner's
        # capture) must see every record.
        logrepeat.install(handlers=[_handler])
    if level is not None:
        root.setLevel("WARNING" if level == "warn" else level.upper())
    if fmt is not None:
        _handler.setFormatter(_FORMATTERS[fmt]())


def _set_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        configure_logging(level=value.lower().replace("warning", "warn"))


def _set_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        configure_logging(fmt=value)


def log_options(defaults: bool) -> list[click.Option]:
    """--log.level and --log.format, on the group and on each subcommand.

    Only the group's have defaults, so a subcommand's, when given, win."""
    return [
        click.Option(
            ["--log.level", "--log-level", "log_level"],
            type=click.Choice([*LOG_LEVELS, "warning"], case_sensitive=False),
            default="info" if defaults else None,
            show_default=defaults,
            envvar=f"{ENV_PREFIX}_LOG_LEVEL",
            expose_value=False,
            is_eager=True,
            callback=_set_level,
            help="Only log lines of this level and above.",
        ),
        click.Option(
            ["--log.format", "log_format"],
            type=click.Choice(list(_FORMATTERS)),
            default="logfmt" if defaults else None,
            show_default=defaults,
            envvar=f"{ENV_PREFIX}_LOG_FORMAT",
            expose_value=False,
            is_eager=True,
            callback=_set_format,
            help="Log lines as logfmt or JSON (stderr).",
        ),
    ]


def _flag_env(opts: list[str]) -> str | None:
    long = next((o for o in opts if o.startswith("--")), None)
    if long is None:
        return None
    return long[2:].replace(".", "_").replace("-", "_").upper()


class _LineList(click.types.StringParamType):
    def split_envvar_value(self, rv: str) -> list[str]:
        return [line for line in rv.splitlines() if line.strip()]


def name_envvars(command: click.Command, command_name: str) -> None:
    """Give `command`'s flags KVOFFLOAD_<COMMAND>_<FLAG>, then KVOFFLOAD_<FLAG> for the
    SHARED_FLAGS.

    Errors about a value from the environment then name its variable."""
    prefix = f"{ENV_PREFIX}_{command_name.replace('-', '_').upper()}"
    for param in command.params:
        if not isinstance(param, click.Option) or param.envvar is not None:
            continue
        flag = _flag_env(param.opts)
        if flag is None:
            continue
        shared = bool(SHARED_FLAGS & set(param.opts))
        param.envvar = [f"{prefix}_{flag}", *([f"{ENV_PREFIX}_{flag}"] if shared else [])]
        if param.multiple and _LINE_LISTS & set(param.opts):
            param.type = _LineList()
        param.get_error_hint = functools.partial(_error_hint, param)  # type: ignore[method-assign]


def env_source(ctx: click.Context, param: click.Parameter) -> str | None:
    """The environment variable `param`'s value came from, or None.

    Click takes the first of its names that is set and not empty."""
    if param.name is None or ctx.get_parameter_source(param.name) is not (
        click.core.ParameterSource.ENVIRONMENT
    ):
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    return next((n for n in names if os.environ.get(n)), None)


def describe_option(ctx: click.Context, param: click.Parameter) -> str:
    """`--flag`, or `--flag (from KVOFFLOAD_…)` when the environment set it.

    An error caused by a stray variable must name the one to unset."""
    flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    var = env_source(ctx, param)
    return f"{flag} (from {var})" if var else flag


def _error_hint(param: click.Parameter, ctx: click.Context) -> str:
    hint = " / ".join(f"'{o}'" for o in param.opts)
    var = env_source(ctx, param)
    return f"{hint} (from {var})" if var else hint


class ExporterGroup(click.Group):
    """A group whose subcommands all take the log flags and read the environment.

    Applied to each subcommand when it is looked up, so commands added anywhere get them."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not any(p.name == "log_format" for p in command.params):
            command.params.extend(log_options(defaults=False))
            name_envvars(command, cmd_name)
        return command


@dataclass(frozen=True)
class WebFlags:
    """Where and how a command serves HTTP."""

    host: str
    port: int
    telemetry_path: str
    config_file: str | None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(
            f"bad listen address {value!r}: use host:port, e.g. 0.0.0.0:{DEFAULT_PORT} "
            f"or :{DEFAULT_PORT} (all interfaces)"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def _listen_option(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def _path_option(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not value.startswith("/") or value == "/":
        raise click.BadParameter(f"{value!r}: a path below /, e.g. /metrics")
    return value


def web_options(default_listen: str, *aliases: str) -> Callable[..., Any]:
    """The three --web.* flags, handed to the command as one `web: WebFlags`."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def command(
            *args: Any,
            web_listen_address: tuple[str, int],
            web_telemetry_path: str,
            web_config_file: str | None,
            **kwargs: Any,
        ) -> Any:
            host, port = web_listen_address
            web = WebFlags(host, port, web_telemetry_path, web_config_file)
            return fn(*args, web=web, **kwargs)

        options = [
            click.option(
                "--web.listen-address",
                *aliases,
                "web_listen_address",
                default=default_listen,
                show_default=True,
                callback=_listen_option,
                help="host:port to listen on (port 0: a free one).",
            ),
            click.option(
                "--web.telemetry-path",
                "web_telemetry_path",
                default="/metrics",
                show_default=True,
                callback=_path_option,
                help="Path of the metrics.",
            ),
            click.option(
                "--web.config.file",
                "web_config_file",
                type=click.Path(dir_okay=False),
                default=None,
                help="TLS (certificate reloaded on change, client CA) and basic auth "
                "(bcrypt), in the web-config format of Prometheus' exporter-toolkit.",
            ),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), or a one-line InputError.

    Bound before the server starts, so nothing is announced for an address in use."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise InputError(f"cannot listen on {shown}: {exc.strerror or exc}") from None
    try:
        # As asyncio's create_server does: a restarted server rebinds despite TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        hint = " (another process has it)" if exc.errno == errno.EADDRINUSE else ""
        raise InputError(
            f"cannot listen on {shown}: {why}{hint}; choose another --web.listen-address"
        ) from None
    return sock


def url(scheme: str, sock: socket.socket, path: str) -> str:
    host, port = sock.getsockname()[:2]
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{path}"


def run_app(app: Any, web: WebFlags, announce: Callable[[str], None]) -> None:
    """Serve an aiohttp app at `web` (its web config applied) until SIGTERM or Ctrl-C.

    `announce` gets the metrics' URL once the address is bound."""
    from kvoffload.cli.server import serve_forever
    from kvoffload.cli.webconfig import WebSecurity

    security = WebSecurity(web.config_file)
    security.install(app)
    sock = listen_socket(web.host, web.port)
    announce(url(security.scheme, sock, web.telemetry_path))
    # aiohttp's run_app behind an accept loop that backs off when file descriptors run out
    # (kvoffload.cli.server), rejected requests logged in one line.
    serve_forever(app, sock, security.ssl_context())
