"""`web`: serve the dashboard (`axa_queue.web`, the `[web]` extra) with uvicorn; and
`serve_demo`, what `demo --web` runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from .. import logs
from ..logs import LogFormat
from ..options import QueueOptions
from ..queue import Queue
from .conventions import (
    Failed,
    checked_dsn,
    connection_options,
    dsn_option,
    log_options,
    reported,
)
from .text import shown

__all__ = ["TOKEN_VARIABLE", "serve", "serve_demo", "web"]

TOKEN_VARIABLE = "AXA_QUEUE_WEB_TOKEN"
"""The environment variable the sign-in token is read from, without `--token-file`."""


def _web() -> Any:
    try:
        from .. import web
    except ImportError as missing:
        raise Failed(str(missing)) from None
    return web


def _read_token(path: Path | None) -> str | None:
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise Failed(
                f"cannot read the token file {shown(str(path))}: {error.strerror}"
            ) from None
        if not text:
            raise Failed(f"the token file {shown(str(path))} is empty")
        return text
    return os.environ.get(TOKEN_VARIABLE) or None


def _mounted(app: Any, base_path: str) -> Any:
    """`app`, served under `base_path` (as a proxy forwarding that prefix would ask)."""
    if not base_path.strip("/"):
        return app
    from starlette.applications import Starlette
    from starlette.routing import Mount

    return Starlette(routes=[Mount("/" + base_path.strip("/"), app)])


def listen(host: str, port: int) -> socket.socket:
    """The socket the dashboard will answer on, bound now: an address in use (or not
    this host's) is one line and exit status 1, before anything says where it is."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise Failed(
            f"cannot listen on {host}:{port}: {error.strerror or error} (give another "
            "--port, or stop what listens there)"
        ) from None
    return sock


async def serve(app: Any, sock: socket.socket) -> None:
    """Serve `app` with uvicorn on `sock` until interrupted (Ctrl-C, SIGTERM)."""
    try:
        import uvicorn
    except ImportError:
        sock.close()
        raise Failed(
            "the dashboard needs the web extra (uvicorn is not installed): "
            "pip install 'axa-queue[web]'"
        ) from None
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve(sockets=[sock])


def _say_where(host: str, port: int, base_path: str, token: str | None, made: bool) -> None:
    shown_host = f"[{host}]" if ":" in host else host
    path = "/" + base_path.strip("/") if base_path.strip("/") else ""
    click.echo(f"the dashboard is at http://{shown_host}:{port}{path}/ (Ctrl-C stops it)")
    if made and token is not None:
        click.echo(f"sign in with this token (made for this run): {token}")


@click.command("web")
@dsn_option
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="The port."
)
@click.option("--read-only", is_flag=True, help="Show everything, offer no act, refuse every act.")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="PATH",
    help=f"A file holding the sign-in token (at least 16 characters). Default: "
    f"${TOKEN_VARIABLE}; with neither (and no --trust-header), a token is made and printed.",
)
@click.option(
    "--trust-header",
    metavar="HEADER",
    help="Sign people in by this header (e.g. X-Forwarded-User) set by a sign-on proxy; "
    "honoured only from the --trusted-proxy addresses.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    metavar="ADDRESS",
    help="An IP address or network (10.0.0.0/8) the --trust-header is honoured from; repeatable.",
)
@click.option(
    "--base-path",
    default="",
    metavar="PATH",
    help="Serve under this path (e.g. /queue), as a proxy forwarding it expects.",
)
@log_options
def web(
    dsn: str | None,
    host: str,
    port: int,
    read_only: bool,
    token_file: Path | None,
    trust_header: str | None,
    trusted_proxies: Sequence[str],
    base_path: str,
    log_format: LogFormat,
    log_level: str,
) -> None:
    """Serve the dashboard: counts and charts, jobs, acts, schedules and workers.

    Signing in is required: with the token and a name (the 'by' of your acts), or
    through a sign-on proxy's header. Listens on 127.0.0.1 unless told otherwise.
    Never shows a job's arguments or result.
    """
    given = checked_dsn(dsn)
    token = _read_token(token_file)
    made = token is None and trust_header is None
    if made:
        token = secrets.token_urlsafe(24)
    options = connection_options(QueueOptions(pool_size=4))
    with reported(given):
        queue = Queue(given, options)
        app = _web().create_app(
            queue,
            token=token,
            read_only=read_only,
            trust_header=trust_header,
            trusted_proxies=list(trusted_proxies),
        )

        async def go() -> None:
            # Refuse to start, with one line saying why, on a database that cannot be
            # reached or lacks the tables (`schema.check`): never an address that
            # answers every page with an error.
            await queue.open(setup=False)
            try:
                sock = listen(host, port)
                # Once it serves: its outages, said as they start and end.
                logs.configure(log_format, log_level.upper())
                _say_where(host, port, base_path, token, made)
                await serve(_mounted(app, base_path), sock)
            finally:
                await queue.close()

        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has stopped cleanly
            asyncio.run(go())


def serve_demo(dsn: str, host: str, port: int) -> None:
    """Run the demo's queue with a trickle of sample jobs on `dsn` and serve the
    dashboard on it, until interrupted; the sign-in token is made and printed."""
    from .. import demo

    web_module = _web()
    token = secrets.token_urlsafe(24)

    async def go() -> None:
        queue = demo.demo_queue(dsn)
        await queue.open()
        stop = asyncio.Event()
        busy = asyncio.ensure_future(demo.keep_busy(queue, stop))
        try:
            app = web_module.create_app(queue, token=token)
            sock = listen(host, port)
            _say_where(host, port, "", token, True)
            await serve(app, sock)
        finally:
            stop.set()
            await busy
            await queue.close()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has stopped cleanly
        asyncio.run(go())
