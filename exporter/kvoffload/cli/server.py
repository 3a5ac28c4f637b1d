"""The HTTP server of every command that listens (serve, sim): aiohttp behind our own accept loop.

The loop is ours so that unauthenticated clients cannot take the server down.
Its limits and what they were measured against: docs/reliability.md ("HTTP connections")."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import re
import resource
import socket
import ssl
import time
from asyncio import sslproto
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_runner import GracefulExit

from kvoffload import logrepeat

log = logging.getLogger("kvoffload.http")

# Failed accepts that mean "out of a resource", where retrying at once cannot succeed.
_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# asyncio retries such accepts without end, logging each; here one pauses accepting (doubling
# from PAUSE_MIN to PAUSE_MAX) and sheds idle connections, as nginx does, with one warning line.
PAUSE_MIN, PAUSE_MAX = 0.05, 1.0
# An idle connection younger than this is spared when connections are shed: a client that
# just connected (a probe) has its request on the way.
IDLE_AGE = 1.0
# Longer than Prometheus' scrape interval (15-60 s), so its connections are reused; aiohttp's
# default for run_app.
KEEPALIVE_SECONDS = 75.0
# Stalled TLS handshakes: each has this long, at most MAX_HANDSHAKES at once (one more closes
# the oldest), on a small read buffer (asyncio's 256 KiB was kept by the heap after close, #25).
TLS_HANDSHAKE_SECONDS = 5
MAX_HANDSHAKES = 128
TLS_READ_BYTES = 16 * 1024  # one TLS record's payload


class _ServerTLS(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a read buffer of one record's size.

    The default 256 KiB buffer per connection was most of what a stalled handshake cost."""

    max_size = TLS_READ_BYTES


_QUOTED = re.compile(r":? (?:bytearray\()?b['\"]")


class _OneLine(logging.Filter):
    """aiohttp's "Error handling request" for a request it could not parse → one line.

    A rejected request (oversized, malformed, too many headers) then logs its status and reason,
    not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            # Without the bytes quoted from the request: the client's, they would make every
            # line new to the repeat filter (a flood of oversized headers, a line each).
            reason = _QUOTED.split(" ".join(str(exc.message).split()), maxsplit=1)[0][:160]
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "rejected a request from %s: %d %s"
            record.args = (remote, exc.code, reason)
            record.exc_info = None
            record.exc_text = None
            if record.levelno > logging.WARNING:  # aiohttp says error; a client's mistake
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


log.addFilter(_OneLine())
# On the logger itself, so a storm is held back whoever configured the handlers.
log.addFilter(logrepeat.RepeatFilter(60.0))


def _file_limit() -> str:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


class Listener(asyncio.AbstractServer):
    """Accepts connections on a listening socket for an aiohttp `web.Server`.

    When accepting fails for want of a resource, it backs off and sheds idle connections."""

    def __init__(
        self,
        sock: socket.socket,
        server: web.Server,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        self.sock = sock
        self.server = server
        self.ssl_context = ssl_context
        self.backlog = backlog
        self.pause = PAUSE_MIN
        self.paused_times = 0  # accepts that failed for want of a resource
        self.shed = 0  # idle connections closed to make room
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._closed = False
        self._resume_handle: asyncio.TimerHandle | None = None
        self._born: dict[Any, float] = {}  # handler → when its connection was accepted
        self._pending: dict[asyncio.Task[None], float] = {}  # connections being set up
        self.handshakes_dropped = 0  # pending handshakes closed to make room (MAX_HANDSHAKES)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        self.sock.listen(self.backlog)
        self._read(True)

    def _read(self, on: bool) -> None:
        assert self._loop is not None
        if on and not self._reading and not self._closed:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True
        elif not on and self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(self.backlog):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._back_off(exc)
                return
            self.pause = PAUSE_MIN
            conn.setblocking(False)
            if self.ssl_context is not None and len(self._pending) >= MAX_HANDSHAKES:
                self._drop_oldest_handshake()
            task = loop.create_task(self._connect(conn))
            self._pending[task] = time.monotonic()
            task.add_done_callback(self._connected)
        if len(self._born) > 2 * len(self.server.connections) + 256:
            self._forget_closed()

    def _drop_oldest_handshake(self) -> None:
        oldest = next(iter(self._pending))  # in the order they were accepted
        del self._pending[oldest]
        oldest.cancel()
        self.handshakes_dropped += 1
        log.warning(
            "%d TLS handshakes pending: the oldest closed to make room (clients that never "
            "finish one?)",
            MAX_HANDSHAKES,
        )

    async def _connect(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            if self.ssl_context is None:
                _transport, handler = await self._loop.connect_accepted_socket(self.server, conn)
            else:
                handler = await self._handshake(conn, self.ssl_context)
        except Exception as exc:  # a failed handshake: the client's business
            log.debug("connection not set up: %s", exc)
            conn.close()
            return
        self._born[handler] = time.monotonic()

    async def _handshake(self, conn: socket.socket, context: ssl.SSLContext) -> Any:
        """Do connect_accepted_socket(ssl=...)'s work on `_ServerTLS`.

        The handler starts once the handshake is done; the connection closes when it fails, times
        out or is dropped."""
        assert self._loop is not None
        handler = self.server()
        done = self._loop.create_future()
        tls = _ServerTLS(
            self._loop,
            handler,
            context,
            done,
            server_side=True,
            ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS,
        )
        transport: asyncio.Transport | None = None
        try:
            transport, _ = await self._loop.connect_accepted_socket(lambda: tls, conn)
            await done
        except BaseException:
            if transport is not None:
                transport.abort()
            raise
        return handler

    def _connected(self, task: asyncio.Task[None]) -> None:
        self._pending.pop(task, None)
        if not task.cancelled():
            task.exception()  # retrieved: nothing left to report

    def _back_off(self, exc: OSError) -> None:
        self._read(False)
        shed = self.shed_idle() if exc.errno in _OUT_OF else 0
        self.paused_times += 1
        log.warning(
            "cannot accept connections: %s (open-file limit %s): accepting paused for up "
            "to %g s, idle connections closed",
            exc.strerror or exc,
            _file_limit(),
            PAUSE_MAX,
        )
        log.debug("accept paused %.2f s, %d idle connections closed", self.pause, shed)
        assert self._loop is not None
        self._resume_handle = self._loop.call_later(self.pause, self._resume)
        self.pause = min(self.pause * 2, PAUSE_MAX)

    def _resume(self) -> None:
        self._resume_handle = None
        self._read(True)

    def _forget_closed(self) -> None:
        alive = set(self.server.connections)
        self._born = {h: t for h, t in self._born.items() if h in alive}

    def shed_idle(self) -> int:
        """Close idle connections and TLS handshakes older than IDLE_AGE; return how many."""
        self._forget_closed()
        cutoff = time.monotonic() - IDLE_AGE
        closed = 0
        for handler, born in list(self._born.items()):
            waiter = getattr(handler, "_waiter", None)  # aiohttp's own idle test
            if born <= cutoff and waiter is not None and not waiter.done():
                handler.force_close()
                del self._born[handler]
                closed += 1
        for task, started in list(self._pending.items()):
            if started <= cutoff:
                task.cancel()
                closed += 1
        self.shed += closed
        return closed

    # asyncio.AbstractServer, as aiohttp's sites use it
    def close(self) -> None:
        self._closed = True
        if self._loop is not None:
            self._read(False)
        if self._resume_handle is not None:
            self._resume_handle.cancel()
        for task in self._pending:
            task.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        return None

    def is_serving(self) -> bool:
        return not self._closed

    async def start_serving(self) -> None:
        return None  # serving since start()

    async def serve_forever(self) -> None:
        while not self._closed:
            await asyncio.sleep(3600)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop


class ListenerSite(web.BaseSite):
    """An aiohttp site on an already bound socket, accepting through a `Listener`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._sock = sock
        self.listener: Listener | None = None

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self.listener = Listener(self._sock, server, self._ssl_context, self._backlog)
        self.listener.start()
        self._server = self.listener


def runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The app's runner as every listening command makes it: no access log, one-line
    rejections, KEEPALIVE_SECONDS."""
    kwargs.setdefault("access_log", None)
    kwargs.setdefault("keepalive_timeout", KEEPALIVE_SECONDS)
    return web.AppRunner(app, logger=log, **kwargs)


def serve_forever(
    app: web.Application, sock: socket.socket, ssl_context: ssl.SSLContext | None
) -> None:
    """Serve `app` on the bound `sock` until SIGTERM or Ctrl-C, then run its cleanup.

    It is aiohttp's run_app with the Listener in place of asyncio's server."""

    async def main() -> None:
        app_runner = runner(app, handle_signals=True)
        await app_runner.setup()
        try:
            await ListenerSite(app_runner, sock, ssl_context).start()
            await asyncio.Event().wait()
        finally:
            await app_runner.cleanup()

    loop = asyncio.new_event_loop()
    task = loop.create_task(main())
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(task)
    except (GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(task)
        finally:
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in rest:
                t.cancel()
            if rest:
                loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
