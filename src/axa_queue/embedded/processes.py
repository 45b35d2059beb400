"""``initdb`` and ``postgres`` as child processes, and the wait until the server is ready.

Both run in a clean environment (no ``PG*`` variable, ``LC_ALL=C``), as the `Account`
when this process is root (its uid and gid, no supplementary group). The server runs in
a session of its own, its output appended to the log, behind ``setpriv --pdeathsig``
where util-linux has it; this module also picks the free ports it listens on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from .accounts import Account
from .install import EmbeddedPostgresError

SUPERUSER = "postgres"
"""The superuser ``initdb`` creates, who logs in without a password (``trust``)."""


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@functools.lru_cache(maxsize=1)
def pdeathsig_wrapper() -> tuple[str, ...]:
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


def _environment() -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PG")}
    environment["LC_ALL"] = "C"
    return environment


def _uid(account: Account | None) -> int | None:
    return account.uid if account is not None else None


def _gid(account: Account | None) -> int | None:
    return account.gid if account is not None else None


def _extra_groups(account: Account | None) -> list[int] | None:
    # Drop root's supplementary groups along with its uid and gid.
    return [] if account is not None else None


def initdb(bin_dir: Path, data_dir: Path, workdir: Path, account: Account | None) -> None:
    """Create the cluster in ``data_dir``: UTF-8, no locale, ``trust`` for `SUPERUSER`."""
    command = [
        str(bin_dir / "initdb"),
        "--pgdata",
        str(data_dir),
        "--username",
        SUPERUSER,
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
            env=_environment(),
            cwd=workdir,
            user=_uid(account),
            group=_gid(account),
            extra_groups=_extra_groups(account),
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise EmbeddedPostgresError(f"could not run initdb: {error}") from error
    if result.returncode != 0:
        raise EmbeddedPostgresError(
            f"initdb failed (exit {result.returncode}) for {data_dir}:\n"
            f"{(result.stderr or result.stdout).strip()}"
        )


def spawn_postgres(
    bin_dir: Path,
    data_dir: Path,
    port: int,
    settings: Mapping[str, str],
    *,
    workdir: Path,
    log_path: Path,
    account: Account | None,
    stop_with_parent: bool,
) -> subprocess.Popen[bytes]:
    """Start the postmaster on ``data_dir`` and ``port``; it has not started up yet."""
    command = [
        *(pdeathsig_wrapper() if stop_with_parent else ()),
        str(bin_dir / "postgres"),
        "-D",
        str(data_dir),
        "-p",
        str(port),
    ]
    for name, value in settings.items():
        command += ["-c", f"{name}={value}"]
    with open(log_path, "ab") as log:
        try:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_environment(),
                cwd=workdir,
                start_new_session=True,
                user=_uid(account),
                group=_gid(account),
                extra_groups=_extra_groups(account),
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise EmbeddedPostgresError(f"could not run postgres: {error}") from error


def wait_until_ready(
    process: subprocess.Popen[bytes], data_dir: Path, log_path: Path, timeout: float
) -> str | None:
    """Wait for postmaster.pid to say ``ready``; return the log's tail on failure.

    A server not ready after ``timeout`` seconds is sent SIGQUIT, then SIGKILL.
    """
    pid_file = data_dir / "postmaster.pid"
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return _tail(log_path) or f"postgres exited with code {process.returncode}"
        with contextlib.suppress(OSError, ValueError):
            lines = pid_file.read_text().splitlines()
            if len(lines) >= 8 and int(lines[0]) == process.pid and lines[7].strip() == "ready":
                return None
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    quit_now(process)
    return f"not ready after {timeout:g} s (startup_timeout)\n" + _tail(log_path)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def quit_now(process: subprocess.Popen[bytes]) -> None:
    """Stop `process` at once: SIGQUIT (PostgreSQL's immediate shutdown), then, if it
    has not exited within 5 s, SIGKILL; wait for it either way."""
    process.send_signal(signal.SIGQUIT)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
