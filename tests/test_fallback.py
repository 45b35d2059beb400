"""On a machine where no PostgreSQL answers, the suite starts an embedded one itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from axa_queue.embedded import is_available

HERE = Path(__file__).parent


@pytest.mark.skipif(not is_available(), reason="the embedded extra is not installed")
def test_the_suite_runs_on_an_embedded_server_when_no_database_answers() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AXA_TEST_DATABASE_URL"}
    # Nothing listens on port 1, and no socket is tried.
    env["AXA_TEST_LOCAL_CANDIDATES"] = "postgresql://root@127.0.0.1:1/test?connect_timeout=2"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            str(HERE / "test_running.py"),
            str(HERE / "test_acts.py"),
            # Not the 106 cases of the acts' input checks: each is a schema, a queue and
            # a refusal like the others, and says nothing more of where the suite runs.
            "-k",
            "not refused_before_anything_is_sent and not refuses_every_change",
        ],
        env=env,
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "using an embedded server" in output
    assert " passed" in output and " failed" not in output
