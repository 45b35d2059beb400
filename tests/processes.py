"""Worker processes for the tests that prove a race across processes: each runs a
script of the test's own (`python worker.py DSN ARG...`, made by `worker_script` from
the lines that make its queue and handlers) that prints `ready` once its queue is
open, and is stopped by SIGTERM (killed if it has not ended 30 s later) when the test
ends. The fixture `worker_processes` (tests/conftest.py) gives each test its own
`WorkerProcesses`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

_SCRIPT_HEAD = '''"""A worker process: python worker.py DSN ARG..."""
import asyncio
import signal
import sys
from datetime import timedelta

from axa_queue import Queue, QueueOptions


def racing(prefetch: int) -> QueueOptions:
    """Four loops that claim as soon as they can, ahead by `prefetch`, and never take a
    run for stale."""
    return QueueOptions(
        workers=4, prefetch=prefetch, poll_interval=0.02, heartbeat_interval=0.5,
        stale_after=30, maintenance_interval=5,
    )


async def main() -> None:
    dsn = sys.argv[1]
'''

_SCRIPT_TAIL = """
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with queue:
        print("ready", flush=True)
        await queue.run(stop)


asyncio.run(main())
"""


def worker_script(body: str) -> str:
    """The script of a worker process: `body` (Python, run in `main()` with `dsn` and
    `sys.argv`'s arguments after it at hand, and `racing(prefetch)`, the options of
    processes that race to claim) makes `queue` and its handlers; the script then opens
    it, prints `ready` and runs it until SIGTERM."""
    return (
        _SCRIPT_HEAD
        + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
        + "\n"
        + _SCRIPT_TAIL
    )


READY_TIMEOUT = 30.0
"""How long a process may take to print `ready` (a loaded machine starts Python slowly)."""

STOP_TIMEOUT = 30.0
"""How long a process may take to end after SIGTERM before it is killed."""


class WorkerProcesses:
    """The worker processes one test started, writing their stderr to a log each in
    `folder` (shown when one does not get ready)."""

    def __init__(self, dsn: str, folder: Path) -> None:
        self.dsn = dsn
        self.folder = folder
        self.started: list[asyncio.subprocess.Process] = []
        self.scripts: dict[str, Path] = {}

    def _script(self, text: str) -> Path:
        """`text` written to a file of its own (once per text)."""
        if text not in self.scripts:
            path = self.folder / f"worker{len(self.scripts) or ''}.py"
            path.write_text(text)
            self.scripts[text] = path
        return self.scripts[text]

    async def _spawn(
        self, script: str, args: Sequence[object]
    ) -> tuple[asyncio.subprocess.Process, Path]:
        log = self.folder / f"worker-{len(self.started)}.log"
        with log.open("wb") as errors:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(self._script(script)),
                self.dsn,
                *(str(arg) for arg in args),
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.started.append(process)
        return process, log

    @staticmethod
    async def _ready(process: asyncio.subprocess.Process, log: Path) -> None:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT)
        if line.strip() != b"ready":
            raise AssertionError(await asyncio.to_thread(log.read_text, errors="replace"))

    async def start(self, script: str, *args: object) -> asyncio.subprocess.Process:
        """Start one process running `script` with `args`; return once it is ready."""
        [process] = await self.start_all(script, [args])
        return process

    async def start_all(
        self, script: str, each: Iterable[Sequence[object]]
    ) -> list[asyncio.subprocess.Process]:
        """Start a process running `script` for each of `each`'s argument lists, all at
        once (their Python starts overlap); return once every one is ready."""
        spawned = [await self._spawn(script, args) for args in each]
        await asyncio.gather(*(self._ready(process, log) for process, log in spawned))
        return [process for process, _ in spawned]

    async def stop(self) -> None:
        """SIGTERM every process still running, and wait for it (kill it after
        `STOP_TIMEOUT`)."""
        for process in self.started:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            if process.returncode is None:
                try:
                    await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
                except asyncio.TimeoutError:
                    process.kill()
                    await process.wait()
