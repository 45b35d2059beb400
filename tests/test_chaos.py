"""The chaos test, short: real worker processes killed, PostgreSQL restarted and down
longer than `stale_after`, an event loop blocked, a transaction held across a worker's
start, chords and chains among the jobs, durable steps and sleeps, on a throwaway embedded server; `bench/chaos.py` checks fencing held from the
database's own record (its docstring says what each check means)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from axa_queue.embedded import is_available

CHAOS = Path(__file__).resolve().parent.parent / "bench" / "chaos.py"


@pytest.mark.skipif(not is_available(), reason="the embedded server is not installed")
@pytest.mark.timeout(240)
def test_under_kills_restarts_an_outage_and_a_blocked_loop_fencing_holds() -> None:
    result = subprocess.run(
        [sys.executable, str(CHAOS), "--seed", "1", "--jobs", "200", "--duration", "12"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=230,
    )
    summary = [line for line in result.stdout.splitlines() if line.startswith("chaos ")]
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert len(summary) == 13 and all(line.endswith(" ok") for line in summary[1:]), "\n".join(
        summary
    )
