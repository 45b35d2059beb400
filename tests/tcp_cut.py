"""A TCP proxy in front of the test server that a test cuts and restores: while cut,
every connection through it is closed and new ones are refused, as a database that
went down would; restored, it forwards again on the same port. It runs on an event
loop in a thread of its own, so it serves sync tests, async ones and browser ones
alike. The shared server itself is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["CutProxy", "cut_proxy"]


class CutProxy:
    """Forwards 127.0.0.1:`port` to the test server's host and port (or its socket,
    for a host that is a directory)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tcp-cut", daemon=True)
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()
        self.passed = 0
        """Connections forwarded so far."""

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host, port = self.target
            if host.startswith("/"):
                up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        self.passed += 1
        self.open |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.open -= {writer, up_writer}

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.open):
            transport = writer.transport
            transport.abort()  # a reset, as a server gone away leaves
        self.open.clear()

    def start(self) -> None:
        self.thread.start()
        self._call(self._listen())

    def cut(self) -> None:
        """Close every connection through the proxy, and refuse new ones."""
        self._call(self._cut())

    def restore(self) -> None:
        """Forward again, on the same port."""
        self._call(self._listen())

    def stop(self) -> None:
        self._call(self._cut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    def dsn(self, dsn: str) -> str:
        """`dsn`, through the proxy."""
        params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "hostaddr"}
        return make_conninfo(**{**params, "host": "127.0.0.1", "port": str(self.port)})


@contextlib.contextmanager
def cut_proxy(dsn: str) -> Iterator[CutProxy]:
    """A started `CutProxy` in front of the server `dsn` names, stopped afterwards."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("hostaddr") or params.get("host") or "/var/run/postgresql")
    proxy = CutProxy(host, int(params.get("port") or 5432))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
