"""The docs run as written, and say what a user needs to configure.

Every fenced block in README.md and docs/*.md names its language. Each ```python
block is a complete program: it is run as a script in a Python process of its own
(forked from a server that imported the package already, and started as `python
script` starts one: `forked`), with `AXA_QUEUE_DSN` set to this test's own schema (a
`postgresql://` URL, as a user's `DATABASE_URL` is) (and nothing else from the queue's
environment), so `asyncio.run`, module-level queues and signals behave as for a user
who pastes it into a file. A block meant to run until stopped (a worker) is preceded by

    <!-- doc-test: interrupt after "TEXT" -->

and is sent SIGINT once it printed TEXT, as a user's Ctrl-C: it must then exit 0
without a traceback. A block that is a test file for the user's own tests
(docs/testing.md) is preceded by

    <!-- doc-test: pytest -->

and is run by pytest instead, in a project of its own where the package is installed
with its entry points (`userproject`), so the plugin's fixtures come as they come to a
user: every test in it must pass. A block whose output must not depend on luck (what
threads and tasks do at once) is preceded by

    <!-- doc-test: repeat 20 -->

and is run that many times at once, each run in a schema of its own: every run must
pass and print the same.

The configuration page names every `QueueOptions` field and every environment variable
the package reads, so a new one cannot go undocumented.
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import os
import re
import selectors
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, urlencode

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import userproject
from axa_queue import QueueOptions
from axa_queue.schema import SETUP_STATEMENTS
from conftest import Schemas, schema_dsn
from forked import Forked, Forker

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
SOURCE = ROOT / "src" / "axa_queue"

RUN_TIMEOUT = 90.0
"""Seconds a block may take (a worker block: to print its marker, then to stop)."""

HIDING_PYTHON = frozenset(
    {"py", "py3", "python3", "python2", "pycon", "pyi", "ipython", "ipython3", "pytb", "pyodide"}
)
"""Tags that render as Python but would not be run: write ```python instead."""

INTERRUPT = re.compile(r'<!--\s*doc-test:\s*interrupt after "([^"]+)"\s*-->')
PYTEST = re.compile(r"<!--\s*doc-test:\s*pytest\s*-->")
REPEAT = re.compile(r"<!--\s*doc-test:\s*repeat\s+(\d+)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int
    """The line of the opening fence, from 1."""
    tag: str
    code: str
    interrupt_after: str | None
    """The text after which the block is sent SIGINT, for blocks that run until stopped."""
    pytest: bool = False
    """Whether the block is a test file, run by pytest with the plugin (see the module)."""
    repeat: int = 1
    """How many times the block is run at once; every run must print the same."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block in `path`, with the `doc-test` directive just before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        tag = opening["info"].strip().split(" ")[0].lower() if opening["info"].strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""
        ):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: a code block is never closed"
        previous = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        directive = INTERRUPT.search(previous)
        repeat = REPEAT.search(previous)
        found.append(
            Block(
                path=path,
                line=i + 1,
                tag=tag,
                code="\n".join(body) + "\n",
                interrupt_after=directive[1] if directive else None,
                pytest=PYTEST.search(previous) is not None,
                repeat=int(repeat[1]) if repeat else 1,
            )
        )
        i = j + 1
    return found


ALL_BLOCKS = [block for path in DOC_FILES for block in blocks_of(path)]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.tag == "python"]
LOOKS_LIKE_PYTHON = re.compile(r"^(import \w|from [\w.]+ import |async def |def \w+\()", re.M)


def test_the_docs_have_python_blocks_to_run() -> None:
    assert len(PYTHON_BLOCKS) >= 5, [b.where for b in PYTHON_BLOCKS]
    assert any(b.interrupt_after for b in PYTHON_BLOCKS), "the README's worker is run too"


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.where for b in ALL_BLOCKS])
def test_every_code_block_names_its_language_and_none_hides_python(block: Block) -> None:
    assert block.tag, (
        f"{block.where}: a code block without a language; write ```python for code to run, "
        "```sh for commands, ```text for output"
    )
    assert block.tag not in HIDING_PYTHON, (
        f"{block.where}: ```{block.tag} is not run by the tests; write ```python and make "
        "the block a complete program"
    )
    if block.tag != "python":
        assert not LOOKS_LIKE_PYTHON.search(block.code), (
            f"{block.where}: this ```{block.tag} block looks like Python; write ```python "
            "and make it a complete program"
        )
    if block.interrupt_after is not None or block.pytest or block.repeat != 1:
        assert block.tag == "python", f"{block.where}: a doc-test directive on a non-Python block"
    assert block.repeat >= 1, f"{block.where}: repeat a block at least once"


def as_url(dsn: str) -> str:
    """The conninfo `dsn` as a `postgresql://` URL, its other parameters (the test's
    `options` and `application_name`) in the query: what a user's `DATABASE_URL` looks
    like, which SQLAlchemy and asyncpg take as well as psycopg."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.pop("user", "")), safe="")
    password = parts.pop("password", None)
    login = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = str(parts.pop("host", ""))
    port = parts.pop("port", None)
    if host.startswith("/"):  # a Unix socket's directory goes in the query
        parts["host"], host = host, ""
    where = f"{host}:{port}" if port and host else host
    if port and not host:
        parts["port"] = port
    dbname = quote(str(parts.pop("dbname", "")), safe="")
    query = urlencode({key: str(value) for key, value in parts.items()}, quote_via=quote)
    return f"postgresql://{login}{where}/{dbname}" + (f"?{query}" if query else "")


def _environment(dsn: str | None) -> dict[str, str]:
    """The caller's environment with the queue's variables replaced by this test's DSN
    (as a URL; none without one)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not (name.startswith("AXA_QUEUE_") or name == "DATABASE_URL")
    }
    if dsn is not None:
        env["AXA_QUEUE_DSN"] = as_url(dsn)
    env["PYTHONUNBUFFERED"] = "1"  # so the marker is seen as soon as it is printed
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
    )
    return env


_forkers: list[Forker] = []
_forker_lock = threading.Lock()


def _forker() -> Forker:
    """This process's fork server for the blocks (`forked`), started at its first use
    with the blocks' environment, the test's DSN aside."""
    with _forker_lock:
        if not _forkers:
            _forkers.append(Forker(_environment(None)))
            atexit.register(_forkers[0].close)
        return _forkers[0]


def _start(script: Path, dsn: str) -> tuple[Forked, BinaryIO, BinaryIO]:
    """Start `script` as `python script` (from the fork server: `forked`), in its folder:
    its process, and its stdout and stderr to read."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        with open(os.devnull, "rb") as nothing:
            process = _forker().start(
                str(script),
                str(script.parent),
                _environment(dsn),
                nothing.fileno(),
                out_w,
                err_w,
            )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return process, open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0)


def _run(block: Block, script: Path, dsn: str) -> tuple[int, str, str]:
    """Run `script` as `python script`; interrupt it after its marker if it has one.
    Returns the exit status, stdout and stderr."""
    process, stdout_pipe, stderr_pipe = _start(script, dsn)
    output = {stdout_pipe: bytearray(), stderr_pipe: bytearray()}
    selector = selectors.DefaultSelector()
    for stream in output:
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + RUN_TIMEOUT
    interrupted = False
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                process.kill()
                process.wait()
                stdout, stderr = (bytes(output[s]).decode(errors="replace") for s in output)
                why = (
                    "did not stop after SIGINT (a worker block must stop on Ctrl-C)"
                    if interrupted
                    else "still running; a block must end by itself, or be a worker preceded "
                    "by a doc-test interrupt directive"
                )
                pytest.fail(
                    f"{block.where}: {why}, after {RUN_TIMEOUT:.0f} s\n"
                    f"stdout:\n{stdout}\nstderr:\n{stderr}"
                )
            for key, _ in selector.select(min(remaining, 1.0)):
                chunk = key.fileobj.read()  # type: ignore[union-attr]
                if chunk:
                    output[key.fileobj].extend(chunk)  # type: ignore[index]
                elif chunk == b"":
                    selector.unregister(key.fileobj)
            if (
                block.interrupt_after is not None
                and not interrupted
                and block.interrupt_after.encode() in output[stdout_pipe]
            ):
                process.send_signal(signal.SIGINT)
                interrupted = True
        status = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        selector.close()
        stdout_pipe.close()
        stderr_pipe.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout = bytes(output[stdout_pipe]).decode(errors="replace")
    stderr = bytes(output[stderr_pipe]).decode(errors="replace")
    if block.interrupt_after is not None:
        assert interrupted, (
            f"{block.where}: never printed {block.interrupt_after!r}\nstdout:\n{stdout}"
            f"\nstderr:\n{stderr}"
        )
    return status, stdout, stderr


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.where for b in PYTHON_BLOCKS])
def test_the_python_block_runs_as_written(
    block: Block, dsn: str, database_url: str, schemas: Schemas, tmp_path: Path
) -> None:
    try:
        ast.parse(block.code, filename=block.where)
    except SyntaxError as error:
        pytest.fail(f"{block.where}: not valid Python: {error}")
    if "axa_queue.embedded" in block.code:
        from axa_queue.embedded import is_available

        if not is_available():
            pytest.skip("the block needs the [embedded] extra")
    if block.pytest:
        _run_tests(block, tmp_path, database_url)
        return
    script = tmp_path / "block.py"
    script.write_text(f"# {block.where}\n{block.code}", encoding="utf-8")
    if block.repeat > 1:
        _run_repeated(block, script, dsn, schemas)
        return
    status, stdout, stderr = _run(block, script, dsn)
    assert status == 0, f"{block.where}: exit status {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert "Traceback" not in stderr, f"{block.where}: printed a traceback\n{stderr}"


def _run_repeated(block: Block, script: Path, dsn: str, schemas: Schemas) -> None:
    """Run `script` `block.repeat` times at once (the first in this test's schema, each
    other in a fresh one, each set up first: the runs' own setups then find nothing to
    do, and do not queue on the database's one setup lock, which is what
    tests/test_setup.py tries): every run must exit 0 without a traceback and print
    what the first printed."""
    made = [schemas.make() for _ in range(block.repeat - 1)]
    try:
        dsns = [dsn, *(schema_dsn(schemas.database_url, name) for name in made)]
        for one in dsns:
            with psycopg.connect(one) as conn, conn.transaction():
                for statement in SETUP_STATEMENTS:
                    conn.execute(statement)
        with ThreadPoolExecutor(len(dsns)) as runs:
            outcomes = list(runs.map(lambda one: _run(block, script, one), dsns))
    finally:
        for name in made:
            schemas.drop(name)
    first = outcomes[0][1]
    for run, (status, stdout, stderr) in enumerate(outcomes, 1):
        said = f"{block.where}, run {run} of {block.repeat}"
        assert status == 0, f"{said}: exit status {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        assert "Traceback" not in stderr, f"{said}: printed a traceback\n{stderr}"
        assert stdout == first, f"{said}: printed\n{stdout}\nbut run 1 printed\n{first}"


def _tests_in(code: str) -> int:
    """How many tests pytest should collect from a test file: its `test_*` functions."""
    return sum(
        1
        for node in ast.parse(code).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    )


def _run_tests(block: Block, project: Path, server: str) -> None:
    """Run a test-file block with pytest in a user's project: every test must pass."""
    count = _tests_in(block.code)
    assert count, f"{block.where}: a pytest block without a test_ function"
    (project / "test_block.py").write_text(f"# {block.where}\n{block.code}", encoding="utf-8")
    outcome = userproject.run_pytest(project, server)
    assert outcome.status == 0 and f"{count} passed" in outcome.output, (
        f"{block.where}: pytest did not pass all {count} tests\n{outcome.output}"
    )


def test_the_harness_runs_a_pytest_block_and_fails_it_when_a_test_fails(
    tmp_path: Path, database_url: str
) -> None:
    code = (
        "async def test_fine(axa_queue_dsn):\n    assert axa_queue_dsn\n\n\n"
        "def test_wrong():\n    assert 1 == 2\n"
    )
    block = Block(ROOT / "docs" / "testing.md", 1, "python", code, None, pytest=True)
    with pytest.raises(AssertionError, match=r"did not pass all 2 tests(.|\n)*1 failed, 1 passed"):
        _run_tests(block, tmp_path, database_url)


def test_the_harness_runs_a_block_that_names_something_it_never_defined_and_fails_it(
    dsn: str, tmp_path: Path
) -> None:
    block = Block(ROOT / "README.md", 1, "python", "print(dsn)\n", None)
    script = tmp_path / "block.py"
    script.write_text(block.code)
    status, _, stderr = _run(block, script, dsn)
    assert status != 0 and "NameError" in stderr


def test_the_harness_sees_a_worker_that_ctrl_c_stops_with_a_traceback(
    dsn: str, tmp_path: Path
) -> None:
    code = (
        "import asyncio\n\n\nasync def main() -> None:\n    print('ready')\n"
        "    await asyncio.Event().wait()\n\n\nasyncio.run(main())\n"
    )
    block = Block(ROOT / "README.md", 1, "python", code, "ready")
    script = tmp_path / "block.py"
    script.write_text(block.code)
    status, _, stderr = _run(block, script, dsn)
    assert status != 0 and "Traceback" in stderr and "KeyboardInterrupt" in stderr


def test_the_harness_runs_a_repeated_block_each_time_and_fails_it_when_one_run_prints_otherwise(
    dsn: str, schemas: Schemas, tmp_path: Path
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- doc-test: repeat 3 -->\n```python\nimport os\n\nprint(os.getpid())\n```\n"
    )
    assert [b.repeat for b in blocks_of(page)] == [3]
    block = Block(
        ROOT / "README.md", 1, "python", "import os\n\nprint(os.getpid())\n", None, repeat=3
    )
    script = tmp_path / "block.py"
    script.write_text(block.code)
    with pytest.raises(AssertionError, match=r"run 2 of 3: printed"):
        _run_repeated(block, script, dsn, schemas)
    script.write_text("print('the same')\n")
    _run_repeated(block, script, dsn, schemas)


def test_the_harness_finds_a_python_block_hidden_behind_another_tag(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```py\nprint(1)\n```\n\n```\nimport os\n```\n\n"
        '<!-- doc-test: interrupt after "ready" -->\n  ```python\n  print("ready")\n  ```\n'
    )
    blocks = blocks_of(page)
    assert [(b.line, b.tag, b.interrupt_after) for b in blocks] == [
        (3, "py", None),
        (7, "", None),
        (12, "python", "ready"),
    ]
    assert blocks[2].code == 'print("ready")\n'
    assert blocks[0].tag in HIDING_PYTHON
    assert LOOKS_LIKE_PYTHON.search(blocks[1].code)


# --- what the configuration page must name ----------------------------------------------------


def _documented_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in DOC_FILES)


def test_the_configuration_page_names_every_queue_option_and_is_linked_from_the_readme() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(QueueOptions) if f"`{f.name}`" not in text]
    assert not missing, f"docs/configuration.md does not describe QueueOptions {missing}"
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def environment_variables_read(folder: Path = SOURCE) -> set[str]:
    """Every environment variable the code in `folder` reads: the names given to
    `os.environ` / `os.getenv`, and the string constants of `*_VARIABLE(S)` names (how
    the package names the variables it reads)."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants: dict[str, ast.expr] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and node.value is not None:
                        constants[target.id] = node.value
        for name, value in constants.items():
            if re.fullmatch(r"[A-Z_]*VARIABLES?", name):
                names.update(
                    n.value
                    for n in ast.walk(value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                )
        for node in ast.walk(tree):
            argument: ast.expr | None = None
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                argument = node.slice
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "os.environ.get",
                "os.getenv",
            ):
                argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                names.add(argument.value)
            elif isinstance(argument, ast.Name) and argument.id in constants:
                value = constants[argument.id]
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.add(value.value)
    return names


def test_every_environment_variable_the_package_reads_is_in_the_docs() -> None:
    read = environment_variables_read()
    assert {"AXA_QUEUE_DSN", "DATABASE_URL", "AXA_QUEUE_MODE"} <= read, read
    text = _documented_text()
    missing = sorted(name for name in read if f"`{name}`" not in text)
    assert not missing, f"environment variables read but not documented: {missing}"
    assert "`AXA_TEST_DATABASE_URL`" in CONFIGURATION.read_text(encoding="utf-8")


def test_every_variable_the_docs_name_is_one_the_code_or_the_tests_read() -> None:
    named = set(re.findall(r"\bAXA_[A-Z0-9_]+\b", _documented_text()))
    named.discard("AXA_QUEUE")  # the Django setting (axa_queue.contrib.django.conf.SETTING)
    read = (
        environment_variables_read()
        | environment_variables_read(ROOT / "tests")
        | environment_variables_read(ROOT / "bench")
    )
    assert "AXA_TEST_DATABASE_URL" in read
    assert not named - read, f"the docs name variables nothing reads: {sorted(named - read)}"


def test_the_url_given_to_the_blocks_reaches_the_tests_schema(dsn: str, schema: str) -> None:
    import psycopg

    url = as_url(dsn)
    assert url.startswith("postgresql://") and "search_path" in url
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW search_path").fetchone() == (schema,)


def test_the_alembic_example_says_the_schema_versions_it_applies() -> None:
    (block,) = [b for b in PYTHON_BLOCKS if "an Alembic migration" in b.code]
    said = re.search(r"schema versions 1 to (\d+)", block.code)
    applied = re.search(r"for version in \(([\d, ]+)\)", block.code)
    assert said and applied, block.where
    versions = [int(v) for v in applied[1].split(",")]
    assert versions == list(range(1, int(said[1]) + 1)), block.where


def test_an_example_that_makes_a_sign_in_token_prints_it() -> None:
    for block in PYTHON_BLOCKS:
        made = re.search(r"^(\s*)(\w+) = secrets\.token_urlsafe\(", block.code, re.M)
        if made:
            assert re.search(rf"print\(.*\{{{made[2]}\}}", block.code), (
                f"{block.where}: makes a token and never prints it: nobody can sign in"
            )
