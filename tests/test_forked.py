"""The fork server the docs' blocks run from (`forked`): a script starts, runs and ends
as under `python script`."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from forked import Forked, Forker


@pytest.fixture(scope="module")
def forker() -> Iterator[Forker]:
    started = Forker(dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        yield started
    finally:
        started.close()


def run(
    forker: Forker, tmp_path: Path, code: str, env: dict[str, str] | None = None
) -> tuple[Forked, str, str]:
    """Run `code` as a script in `tmp_path`; wait for it; its process and output."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    out, err = tmp_path / "out", tmp_path / "err"
    with open(os.devnull, "rb") as stdin, out.open("wb") as stdout, err.open("wb") as stderr:
        process = forker.start(
            str(script),
            str(tmp_path),
            env if env is not None else dict(os.environ, PYTHONUNBUFFERED="1"),
            stdin.fileno(),
            stdout.fileno(),
            stderr.fileno(),
        )
    process.wait(60)
    return process, out.read_text(), err.read_text()


def test_a_script_has_its_own_environment_folder_arguments_and_path(
    forker: Forker, tmp_path: Path
) -> None:
    process, out, err = run(
        forker,
        tmp_path,
        """
        import os, sys
        print(os.environ["ONLY_HERE"], os.getcwd(), sys.argv, sys.path[0], __name__)
        print("PYTHONUNBUFFERED" in os.environ)  # the server's, not given to the script
        """,
        env={"ONLY_HERE": "yes", "PATH": os.environ.get("PATH", "")},
    )
    script = str(tmp_path / "script.py")
    assert (process.returncode, err) == (0, "")
    assert out.splitlines() == [f"yes {tmp_path} {[script]} {tmp_path} __main__", "False"]


def test_a_script_exits_with_its_status_and_an_uncaught_exception_with_1_and_a_traceback(
    forker: Forker, tmp_path: Path
) -> None:
    assert run(forker, tmp_path, "import sys\nsys.exit(3)\n")[0].returncode == 3
    process, _, err = run(forker, tmp_path, "print(never_defined)\n")
    assert process.returncode == 1
    assert "Traceback" in err and "NameError" in err


def test_non_daemon_threads_and_atexit_functions_run_before_the_script_ends(
    forker: Forker, tmp_path: Path
) -> None:
    process, out, _ = run(
        forker,
        tmp_path,
        """
        import atexit, threading, time
        atexit.register(lambda: print("atexit"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
        print("main")
        """,
    )
    assert process.returncode == 0
    assert out.splitlines() == ["main", "thread", "atexit"]


def test_a_sigint_reaches_the_script_as_a_keyboard_interrupt(
    forker: Forker, tmp_path: Path
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            try:
                print("ready")
                time.sleep(60)
            except KeyboardInterrupt:
                print("interrupted")
            """
        )
    )
    read, write = os.pipe()
    with open(os.devnull, "rb") as stdin:
        process = forker.start(
            str(script),
            str(tmp_path),
            dict(os.environ, PYTHONUNBUFFERED="1"),
            stdin.fileno(),
            write,
            write,
        )
    os.close(write)
    with open(read, "rb") as output:
        assert output.readline() == b"ready\n"  # printed: now in its sleep, or nearly
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert output.read() == b"interrupted\n"


def test_two_scripts_draw_different_random_numbers(forker: Forker, tmp_path: Path) -> None:
    code = "import random\nprint(random.random())\n"
    assert run(forker, tmp_path, code)[1] != run(forker, tmp_path, code)[1]
