"""Python scripts run as `python script` runs them, each in a process of its own forked
from one that imported the package already (`Forker`): about 0.2 s of CPU less a script.

A script's process starts as `python script` starts one: its own environment, working
directory, `sys.argv`, `sys.path[0]` (the script's folder), standard streams (the file
descriptors given), signal handlers and a fresh seed for `random`; it runs the script
as `__main__`; then, as the interpreter does at exit, it waits for its non-daemon
threads, runs the `atexit` functions and flushes its streams. An exception it does not
catch is printed with its traceback and exits 1, `SystemExit` exits as it says. What it
shares with its siblings is what the server imported (`PRELOAD`, read before the
script's environment was set) and the hash seed.

The server reads one request a message on a `SOCK_SEQPACKET` socket (the script, its
folder, its environment, and its three standard streams passed as file descriptors),
answers with the pid it forked, and sends each pid's wait status when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

PRELOAD = ("asyncio", "axa_queue")
"""What the server imports before it forks: what nearly every block imports first."""


class Forked:
    """A script's process, as far as `subprocess.Popen` is used on one (`Forker.start`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._ended.is_set():
            with contextlib.suppress(ProcessLookupError):  # ended: its status is on its way
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forker:
    """A server process that forks scripts' processes (see the module). Thread-safe."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.started_ready = threading.Condition()
        self.table = threading.Lock()
        """Guards `running` and `early`, which `start` and the reader both change."""
        self.running: dict[int, Forked] = {}
        self.early: dict[int, int] = {}
        self.reader = threading.Thread(target=self._read, name="forker", daemon=True)
        self.reader.start()

    def start(
        self, script: str, cwd: str, env: dict[str, str], stdin: int, stdout: int, stderr: int
    ) -> Forked:
        """Start `script` as `python script` would (see the module): its process."""
        request = json.dumps({"script": script, "cwd": cwd, "env": env}).encode()
        with self.lock:
            socket.send_fds(self.sock, [request], [stdin, stdout, stderr])
            with self.started_ready:
                while not self.started:
                    if not self.started_ready.wait(30):
                        raise RuntimeError("the fork server did not start a script")
                pid = self.started.pop(0)
            if pid < 0:
                raise RuntimeError("the fork server could not start a script")
            child = Forked(pid)
            with self.table:
                status = self.early.pop(pid, None)
                if status is None:
                    self.running[pid] = child
            if status is not None:
                child._end(status)
        return child

    def _read(self) -> None:
        while message := self.sock.recv(256):
            kind, pid, status = message.decode().split()
            if kind == "started":
                with self.started_ready:
                    self.started.append(int(pid))
                    self.started_ready.notify_all()
                continue
            with self.table:
                child = self.running.pop(int(pid), None)
                if child is None:  # ended before `start` had it: it takes it from here
                    self.early[int(pid)] = int(status)
            if child is not None:
                child._end(int(status))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # the server sees the end, the reader too
        self.reader.join(10)
        self.sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- the server --------------------------------------------------------------------


def _serve(fd: int) -> None:
    import importlib
    import selectors

    for module in PRELOAD:
        importlib.import_module(module)
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    default_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGCHLD, signal.SIGINT)}
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the scripts
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    message, fds, _flags, _address = socket.recv_fds(sock, 1 << 20, 3)
                except OSError:
                    message, fds = b"", []
                if not message:
                    return  # the tests' process closed its end: done
                try:
                    pid = os.fork()
                except OSError:
                    pid = -1
                if pid == 0:
                    selector.close()
                    sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    signal.set_wakeup_fd(-1)
                    for sig, handler in default_handlers.items():
                        signal.signal(sig, handler)
                    _run(json.loads(message), fds)  # never returns
                for one in fds:
                    os.close(one)
                if not _say(sock, f"started {pid} 0"):
                    return
            else:
                os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if not _say(sock, f"ended {pid} {status}"):
                    return


def _say(sock: socket.socket, message: str) -> bool:
    """Send `message` to the tests' process: whether it is still there."""
    try:
        sock.send(message.encode())
        return True
    except OSError:
        return False


def _run(request: dict[str, Any], fds: list[int]) -> None:
    import atexit
    import io
    import random
    import runpy
    import traceback

    code = 1
    try:
        for target, one in enumerate(fds):
            os.dup2(one, target)
            os.close(one)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        script = request["script"]
        sys.argv = [script]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding="utf-8",
                errors="backslashreplace" if fd == 2 else "strict",
                line_buffering=fd == 2 or unbuffered,
                write_through=unbuffered,
            )
            for fd in (1, 2)
        )
        random.seed()
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None:
                code = 0
            elif isinstance(stop.code, int):
                code = stop.code
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does at exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
