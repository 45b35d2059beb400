"""The README's quick start runs word for word on a machine like a fresh Debian one.

A new user (no pyenv, no PIP_* variables, nothing installed: only the system Python on
PATH) copies this checkout and runs the quick start's first command exactly as the README
writes it: it makes a virtual environment, installs the small set and runs the demo on an
embedded PostgreSQL. The second command is the README's test command (CI runs it).

It makes a user and installs from the package index, so it runs where CI asks for it
(`AXA_TEST_QUICKSTART=1`, set by `.ci/run`, as root) and is skipped elsewhere.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NEWCOMER = "axa-newcomer"
"""The new user the quick start runs as."""


def quick_start() -> list[str]:
    """The commands of the README's quick start, as written (the block after the
    `<!-- quick-start -->` marker)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- quick-start -->")
    assert lines[start + 1] == "```sh", "the quick start is a ```sh block"
    end = lines.index("```", start + 2)
    return lines[start + 2 : end]


def test_the_quick_start_is_two_commands_and_the_second_runs_the_readmes_test_command() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    test_command = lines[lines.index("<!-- test-command -->") + 2]
    first, second = quick_start()
    assert "axa-queue demo" in first and "[dev]" not in first
    assert second.endswith(test_command)


def _newcomer_home() -> Path:
    try:
        return Path(pwd.getpwnam(NEWCOMER).pw_dir)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", NEWCOMER], check=True)
        return Path(pwd.getpwnam(NEWCOMER).pw_dir)


def _copy_checkout(to: Path) -> None:
    """The checkout's files as a clone has them (tracked, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = to / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.mark.timeout(600)
def test_the_quick_starts_first_command_installs_and_runs_the_demo_as_a_new_user() -> None:
    if not os.environ.get("AXA_TEST_QUICKSTART"):
        pytest.skip("makes a user and installs from the package index: AXA_TEST_QUICKSTART=1")
    if os.geteuid() != 0:
        pytest.fail("AXA_TEST_QUICKSTART is set but the test is not root: it cannot add a user")
    if not Path("/usr/bin/python3").exists():
        pytest.fail("no system Python at /usr/bin/python3")
    home = _newcomer_home()
    clone = home / f"axa-queue-{uuid.uuid4().hex[:8]}"
    try:
        _copy_checkout(clone)
        subprocess.run(["chown", "-R", f"{NEWCOMER}:", str(clone)], check=True)
        first = quick_start()[0]
        fresh = {
            "HOME": str(home),
            "USER": NEWCOMER,
            "LOGNAME": NEWCOMER,
            "PATH": "/usr/bin:/bin",  # the system Python only: no pyenv, no /usr/local
            "LANG": "C.UTF-8",
        }
        variables = [f"{name}={value}" for name, value in fresh.items()]
        done = subprocess.run(
            ["su", NEWCOMER, "-c", shlex.join(["env", "-i", *variables, "bash", "-c", first])],
            cwd=clone,
            capture_output=True,
            text=True,
            timeout=540,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        assert "jobs settled" in output and "nothing was left behind" in output, output[-4000:]
        assert (clone / ".venv" / "bin" / "axa-queue").exists()
    finally:
        shutil.rmtree(clone, ignore_errors=True)
