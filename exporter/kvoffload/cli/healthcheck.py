"""`kvoffload healthcheck`: the container's probe of its own sidecar."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from kvoffload.cli.flags import (
    DEFAULT_PORT,
)
from kvoffload.flagvalues import duration_callback

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    pass


def _serve_env(flag: str) -> list[str]:
    """healthcheck reads the variables `serve` does (the container sets them for serve)."""
    return [f"KVOFFLOAD_HEALTHCHECK_{flag}", f"KVOFFLOAD_SERVE_{flag}", f"KVOFFLOAD_{flag}"]


@click.command()
@click.option(
    "--web.listen-address",
    "listen",
    default=f"0.0.0.0:{DEFAULT_PORT}",
    show_default=True,
    envvar=_serve_env("WEB_LISTEN_ADDRESS"),
    help="The address `serve` listens on.",
)
@click.option(
    "--web.config.file",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar=_serve_env("WEB_CONFIG_FILE"),
    help="`serve`'s web config: with TLS in it the check speaks https.",
)
@click.option("--timeout", callback=duration_callback, default="4s", show_default=True)
def healthcheck(listen: str, config_file: str | None, timeout: float) -> None:
    """Exit 0 when the sidecar on this host answers /healthz, else 1 (a container's HEALTHCHECK).

    It reads the address and scheme from the same flags and variables as `serve`."""
    import ssl
    import urllib.error
    import urllib.request

    from kvoffload.cli.flags import parse_listen
    from kvoffload.cli.webconfig import parse_web_config

    host, port = parse_listen(listen)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    tls = config_file is not None and parse_web_config(config_file).tls
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if tls else 'http'}://{shown}:{port}/healthz"
    context = None
    if tls:
        # A liveness probe of our own loopback listener: its certificate names a service,
        # not 127.0.0.1, so it is not verified here.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            ok = answer.status == 200
    except (OSError, urllib.error.URLError) as exc:
        click.echo(f"kvoffload: healthcheck: {url}: {exc}", err=True)
        sys.exit(1)
    if not ok:
        click.echo(f"kvoffload: healthcheck: {url}: HTTP {answer.status}", err=True)
        sys.exit(1)
