"""A real PgBouncer for the tests: started on a free local port in front of the test
server, in session or transaction mode, and stopped afterwards.

It needs Debian's `pgbouncer` package (`.ci/run` installs it in CI); without it the
tests that use it are skipped, saying why. PgBouncer refuses to run as root, so as
root it is started as `nobody` (`-u nobody`), in a temporary directory that user can
read. Clients log in with the server's user and no password (`auth_type = trust`);
PgBouncer logs in to the server as that user, with the password of the test server's
DSN when it has one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["PgBouncer", "binary", "start"]


def binary() -> str | None:
    """The `pgbouncer` binary, if installed (Debian puts it in /usr/sbin)."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: `dsn(...)` reaches the test database through it."""

    mode: str
    host: str
    port: int
    user: str
    dbname: str

    def dsn(self, **params: str) -> str:
        """A DSN through the bouncer, with extra libpq parameters."""
        return make_conninfo(
            "", host=self.host, port=str(self.port), user=self.user, dbname=self.dbname, **params
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


STARTS = 3
"""Ports tried: another process may take the free port found before PgBouncer binds it."""


@contextmanager
def start(database_url: str, mode: str, pool_size: int = 20) -> Iterator[PgBouncer]:
    """Run PgBouncer in `mode` (session or transaction) in front of `database_url`,
    `pool_size` server connections at most, until the block ends.

    A port is free when it is chosen, not when PgBouncer binds it: another process may
    listen there in between, PgBouncer then exits, and a check that only connects
    reaches the other process (which goes away later: "connection refused" in the
    middle of the session). So the check asks PgBouncer's console for its configuration
    and looks for this instance's mark; a PgBouncer that exited is started again on
    another port."""
    found = binary()
    if found is None:
        raise FileNotFoundError("pgbouncer is not installed")
    params = conninfo_to_dict(database_url)
    host = str(params.get("host") or "127.0.0.1")
    if host.startswith("/"):
        host = "127.0.0.1"  # a socket directory nobody may not read: go by TCP
    server_port = str(params.get("port") or "5432")
    user = str(params.get("user") or os.environ.get("USER") or "postgres")
    dbname = str(params.get("dbname") or user)
    password = f" password={params['password']}" if params.get("password") else ""
    for attempt in range(1, STARTS + 1):
        port = _free_port()
        mark = f"axa-{uuid.uuid4().hex}"
        with tempfile.TemporaryDirectory(prefix="axa-pgbouncer-") as tmp:
            here = Path(tmp)
            (here / "users.txt").write_text(f'"{user}" ""\n')
            (here / "pgbouncer.ini").write_text(
                "[databases]\n"
                f"{dbname} = host={host} port={server_port} dbname={dbname} user={user}{password}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
                f"unix_socket_dir =\nauth_type = trust\nauth_file = {here / 'users.txt'}\n"
                f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
                "ignore_startup_parameters = extra_float_digits\n"
                f"server_reset_query = DISCARD ALL /* {mark} */\n"
                f"stats_users = {user}\n"
                "log_connections = 0\nlog_disconnections = 0\n"
            )
            command = [found, str(here / "pgbouncer.ini")]
            if os.geteuid() == 0:
                os.chmod(tmp, 0o755)  # nobody must read its configuration
                command[1:1] = ["-u", "nobody"]
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            bouncer = PgBouncer(mode, "127.0.0.1", port, user, dbname)
            try:
                if not _ours(bouncer, process, mark):
                    output = process.communicate(timeout=5)[0]
                    if attempt == STARTS:
                        raise RuntimeError(f"pgbouncer did not start: {output}")
                    continue
                yield bouncer
                return
            finally:
                if process.poll() is None:
                    process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _ours(bouncer: PgBouncer, process: subprocess.Popen[str], mark: str) -> bool:
    """Whether this `process` answers on the bouncer's port (its console shows `mark`),
    tried for up to 15 s; False once it has exited (or is killed at the deadline)."""
    console = make_conninfo(bouncer.dsn(connect_timeout="2"), dbname="pgbouncer")
    deadline = time.monotonic() + 15
    while True:
        try:
            with psycopg.connect(console, autocommit=True, prepare_threshold=None) as conn:
                rows = conn.execute("SHOW CONFIG").fetchall()
            if any(mark in str(value) for _, value, *_ in rows):
                return True
        except psycopg.Error:
            pass
        if process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            process.kill()
            return False
        time.sleep(0.05)
