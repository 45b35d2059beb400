"""`EmbeddedPostgres`: the server's life cycle, from its first start to its last close.

It holds the state (the private directory, the port, the postmaster process) and the
lock around it; the other modules of the package do each step: `install` finds the
binaries, `accounts` and `workdir` make the directories, `processes` runs ``initdb`` and
``postgres`` and waits until the server is ready.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from .accounts import account_named, make_private_dir, running_as_root
from .install import EmbeddedPostgresError, site_root
from .processes import (
    SUPERUSER,
    free_port,
    initdb,
    port_is_free,
    quit_now,
    spawn_postgres,
    wait_until_ready,
)
from .workdir import binaries, data_directory, make_workdir

_DATABASE = "postgres"
_FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "logging_collector": "off",
}
_STOP_SIGNALS: Mapping[str, signal.Signals] = {
    "smart": signal.SIGTERM,
    "fast": signal.SIGINT,
    "immediate": signal.SIGQUIT,
}
_BIND_FAILURES = ("could not bind", "Address already in use", "could not create any TCP/IP")
_START_ATTEMPTS = 3

StopMode = Literal["smart", "fast", "immediate"]
"""How the server ends its sessions: see PostgreSQL's ``pg_ctl stop -m``."""


class EmbeddedPostgres:
    """A private PostgreSQL server in a temporary directory, started and stopped by you.

    Use it as a context manager; the server starts on entry and, on exit (also on an
    exception), stops with a fast shutdown and its temporary directory is removed::

        with EmbeddedPostgres() as server:
            with psycopg.connect(server.dsn) as conn:
                conn.execute("CREATE TABLE t (x int)")

    Or call :meth:`start`, :meth:`stop` (which keeps the data, so :meth:`start` can
    follow) and finally :meth:`close`. A server still running when the interpreter exits
    is closed by an ``atexit`` hook; one whose Python process is killed receives SIGINT
    from the kernel where ``setpriv`` is available (see ``stop_with_parent``).

    Args:
        data_dir: Where the cluster lives. ``None`` (the default) makes a fresh one inside
            the temporary directory, removed on :meth:`close`. A path you give is created
            if missing, reused if it already holds a cluster, and never removed.
        port: The TCP port. ``None`` picks a free one (never 5432, which is in no
            ephemeral range). With ``host=None`` it only names the Unix socket.
        host: The address to listen on, ``127.0.0.1`` by default. ``None`` listens on
            a Unix socket only, in a directory only the server's user can enter; the DSN
            then names that directory.
        run_as: When this process is root, the unprivileged user that runs PostgreSQL.
            Ignored otherwise.
        settings: Extra server settings (``postgresql.conf`` names), on top of
            ``fsync=off``, ``synchronous_commit=off`` and ``full_page_writes=off``.
        startup_timeout: Seconds to wait for the server to accept connections.
        stop_with_parent: Have the kernel stop the server if this process dies (Linux,
            ``setpriv`` from util-linux). The kernel counts the *thread* that called
            :meth:`start` as the parent: start the server from a thread that outlives it.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        host: str | None = "127.0.0.1",
        run_as: str = "nobody",
        settings: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        stop_with_parent: bool = True,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise EmbeddedPostgresError(f"port must be between 1 and 65535, not {port}")
        self._site = site_root()
        self._given_data_dir = Path(data_dir).absolute() if data_dir is not None else None
        self._given_port = port
        self._host = host
        self._account = account_named(run_as) if running_as_root() else None
        self._settings = dict(settings or {})
        self._startup_timeout = startup_timeout
        self._stop_with_parent = stop_with_parent
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        self._workdir: Path | None = None
        self._bin: Path | None = None
        self._data_dir: Path | None = None
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    # -- what to connect to -------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """A libpq connection URL for the superuser ``postgres`` and database ``postgres``.

        The user may create schemas, tables and databases. Raises
        :class:`EmbeddedPostgresError` before the server has started.
        """
        port = self.port
        if self._host is None:
            return (
                f"postgresql://{SUPERUSER}@/{_DATABASE}"
                f"?host={quote(str(self._socket_dir()), safe='/')}&port={port}"
            )
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"postgresql://{SUPERUSER}@{host}:{port}/{_DATABASE}"

    @property
    def host(self) -> str:
        """The listening address, or the Unix socket's directory when ``host=None``."""
        return self._host if self._host is not None else str(self._socket_dir())

    @property
    def port(self) -> int:
        """The port the server listens on (for a Unix socket, the number in its name)."""
        if self._port is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._port

    @property
    def user(self) -> str:
        """The database superuser to log in as."""
        return SUPERUSER

    @property
    def dbname(self) -> str:
        """The database that exists from the start."""
        return _DATABASE

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        if self._data_dir is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._data_dir

    @property
    def workdir(self) -> Path | None:
        """The private temporary directory (socket, log, binaries), until :meth:`close`."""
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The server's log file, inside :attr:`workdir`."""
        if self._workdir is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._workdir / "postgres.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs, else ``None``."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.pid is not None

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the server, creating the directories and the cluster the first time.

        Returns once the server accepts connections. Does nothing if it already runs.
        """
        with self._lock:
            if self._closed:
                raise EmbeddedPostgresError("this embedded server was closed; make a new one")
            if self.running:
                return
            if self._workdir is None:
                self._prepare()
            self._launch()

    def stop(self, mode: StopMode = "fast", timeout: float = 30.0) -> None:
        """Stop the server and wait for it to exit; the data and directories stay.

        ``fast`` (the default) ends open sessions; ``smart`` waits for them to end;
        ``immediate`` skips the shutdown checkpoint. A server that has not exited after
        ``timeout`` seconds is sent SIGQUIT, then SIGKILL.
        """
        with self._lock:
            process = self._process
            if process is None or os.getpid() != self._owner_pid:
                return
            if process.poll() is None:
                process.send_signal(_STOP_SIGNALS[mode])
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    quit_now(process)
            self._process = None

    def close(self) -> None:
        """Stop the server and remove the temporary directory. Safe to call twice.

        A ``data_dir`` you passed is kept; the temporary directory (socket, log, binaries
        and, by default, the data) is removed.
        """
        with self._lock:
            if os.getpid() != self._owner_pid:
                return
            try:
                self.stop()
            finally:
                self._closed = True
                atexit.unregister(self.close)
                if self._workdir is not None:
                    shutil.rmtree(self._workdir, ignore_errors=True)
                    self._workdir = None

    def __enter__(self) -> EmbeddedPostgres:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "closed" if self._closed else "stopped"
        where = f" {self.dsn}" if self._port is not None and not self._closed else ""
        return f"<EmbeddedPostgres {state}{where}>"

    # -- internals ----------------------------------------------------------------------

    def _socket_dir(self) -> Path:
        if self._workdir is None:
            raise EmbeddedPostgresError("the embedded server has not been started")
        return self._workdir / "socket"

    def _prepare(self) -> None:
        """Make the private directory, the binaries' mirror if root, and the cluster."""
        account = self._account
        workdir = make_workdir(account)
        self._workdir = workdir
        atexit.register(self.close)
        try:
            self._bin = binaries(self._site, workdir, account)
            make_private_dir(workdir / "socket", account)
            self._data_dir = data_directory(workdir, self._given_data_dir, account)
            if not (self._data_dir / "PG_VERSION").exists():
                initdb(self._bin, self._data_dir, workdir, account)
        except BaseException:
            self.close()
            raise

    def _choose_port(self, attempt: int) -> int:
        if self._given_port is not None:
            return self._given_port
        host = self._host or "127.0.0.1"
        if attempt == 0 and self._port is not None and port_is_free(host, self._port):
            return self._port
        return free_port(host)

    def _launch(self) -> None:
        for attempt in range(_START_ATTEMPTS):
            self._port = self._choose_port(attempt)
            process = self._spawn()
            try:
                assert self._data_dir is not None
                failure = wait_until_ready(
                    process, self._data_dir, self.log_path, self._startup_timeout
                )
            except BaseException:
                self._process = process
                self.stop("immediate", timeout=5)
                raise
            if failure is None:
                self._process = process
                return
            retry = (
                self._given_port is None
                and self._host is not None
                and attempt + 1 < _START_ATTEMPTS
                and any(marker in failure for marker in _BIND_FAILURES)
            )
            if not retry:
                raise EmbeddedPostgresError(
                    f"the embedded PostgreSQL server did not start ({self.log_path}):\n{failure}"
                )

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self._bin is not None and self._data_dir is not None and self._port is not None
        assert self._workdir is not None
        settings = {
            **_FAST_SETTINGS,
            "listen_addresses": self._host or "",
            "unix_socket_directories": str(self._socket_dir()),
            **self._settings,
        }
        return spawn_postgres(
            self._bin,
            self._data_dir,
            self._port,
            settings,
            workdir=self._workdir,
            log_path=self.log_path,
            account=self._account,
            stop_with_parent=self._stop_with_parent,
        )
