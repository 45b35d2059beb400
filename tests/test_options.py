"""Options and the public surface: defaults, validation messages, no I/O before open,
arguments never shown, a pinned `__all__` with docstrings, and no unused statement."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import re
import typing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import axa_queue
from axa_queue import NewJob, OptionsError, Queue, QueueOptions, Schedule, sql
from axa_queue.options import Duration, DurationOption, OptionalDurationOption
from conftest import eventually, running, status_of

SECRET = "943 476 5919"
"""An NHS number: what must never leave the `args` column."""


def shows_secret(text: object) -> bool:
    """Whether `text` holds the secret, spaced or not."""
    return any(form in str(text) for form in (SECRET, SECRET.replace(" ", "")))


PACKAGE = Path(axa_queue.__file__).parent


# --- defaults and validation ----------------------------------------------------------


def test_the_defaults_are_the_reference_crates() -> None:
    options = QueueOptions()
    assert options.workers == 2
    assert options.poll_interval == timedelta(seconds=1)
    assert options.stale_after == timedelta(minutes=60)
    assert options.heartbeat_interval == timedelta(minutes=1)
    assert options.max_attempts == 1
    assert options.retry_backoff == timedelta(seconds=30)
    assert options.retention == timedelta(days=7)
    assert options.keep_recent == timedelta(minutes=1)
    assert options.maintenance_interval == timedelta(minutes=5)
    assert options.mode is None
    assert options.unhandled_after == timedelta(minutes=10)
    assert options.unknown_names == "accept"


@pytest.mark.parametrize(
    "given", [0.25, 2, timedelta(milliseconds=250)], ids=["float", "int", "timedelta"]
)
def test_durations_take_a_timedelta_or_seconds_and_read_back_as_a_timedelta(given) -> None:
    options = QueueOptions(poll_interval=given, retry_backoff=given)
    expected = given if isinstance(given, timedelta) else timedelta(seconds=given)
    assert options.poll_interval == expected and options.retry_backoff == expected
    assert isinstance(options.poll_interval, timedelta)


def test_every_duration_option_is_typed_a_timedelta_when_read_and_a_duration_when_given() -> None:
    # What mypy reads: each duration field is a descriptor whose `__get__` returns a
    # `timedelta` (or `timedelta | None`) and whose `__set__` takes a `Duration`.
    durations = {
        field.name: vars(QueueOptions)[field.name]
        for field in dataclasses.fields(QueueOptions)
        if isinstance(field.default, timedelta) or field.name == "shutdown_grace"
    }
    assert set(durations) == {
        "poll_interval",
        "heartbeat_interval",
        "stale_after",
        "retry_backoff",
        "retention",
        "keep_recent",
        "maintenance_interval",
        "setup_lock_timeout",
        "wait_for_database",
        "unhandled_after",
        "shutdown_grace",
    }
    for name, option in durations.items():
        typed = OptionalDurationOption if name == "shutdown_grace" else DurationOption
        assert type(option) is typed, name
    assert typing.get_type_hints(DurationOption.__get__)["return"] is timedelta
    assert typing.get_type_hints(DurationOption.__set__)["value"] == Duration
    assert typing.get_type_hints(OptionalDurationOption.__get__)["return"] == timedelta | None
    options = QueueOptions(stale_after=600, heartbeat_interval=60.0, shutdown_grace=2)
    assert options.stale_after.total_seconds() == 600.0
    assert options.shutdown_grace == timedelta(seconds=2)
    assert QueueOptions().shutdown_grace is None
    assert dataclasses.replace(options, workers=3).stale_after == timedelta(minutes=10)
    assert options == QueueOptions(
        stale_after=timedelta(minutes=10), heartbeat_interval=60, shutdown_grace=2.0
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.stale_after = timedelta(0)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"workers": 0}, ["workers", "0"]),
        ({"workers": 2.5}, ["workers", "2.5"]),
        ({"poll_interval": -1}, ["poll_interval", "-1"]),
        ({"poll_interval": 0}, ["poll_interval", "0"]),
        ({"poll_interval": "1s"}, ["poll_interval", "'1s'"]),
        ({"retry_backoff": float("nan")}, ["retry_backoff", "nan"]),
        (
            {"heartbeat_interval": 60, "stale_after": 60},
            ["heartbeat_interval", "stale_after", "0:01:00"],
        ),
        (
            {"heartbeat_interval": 120, "stale_after": 60},
            ["heartbeat_interval", "stale_after", "0:02:00"],
        ),
        ({"mode": "x"}, ["mode", "'x'"]),
        ({"max_attempts": 0}, ["max_attempts", "0"]),
        ({"max_attempts": True}, ["max_attempts", "True"]),
        ({"prefetch": -1}, ["prefetch", "-1", '"auto"']),
        ({"prefetch": "fast"}, ["prefetch", "'fast'"]),
        ({"unknown_names": "ignore"}, ["unknown_names", "'ignore'", "accept", "refuse"]),
        ({"unhandled_after": -5}, ["unhandled_after", "-5"]),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, list) else None,
)
def test_a_nonsense_option_is_refused_naming_the_option_and_the_value(options, named) -> None:
    with pytest.raises(OptionsError) as raised:
        QueueOptions(**options)
    message = str(raised.value)
    for part in named:
        assert part in message, message
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"priority": 40000}, ["priority", "40000", "32767"]),
        ({"priority": -40000}, ["priority", "-40000"]),
        ({"run_at": datetime(2030, 1, 1, 2, 0)}, ["run_at", "timezone"]),
        (
            {"run_in": 5, "run_at": datetime(2030, 1, 1, tzinfo=timezone.utc)},
            ["run_in", "run_at"],
        ),
        ({"max_attempts": 0}, ["max_attempts", "0"]),
        ({"timeout": 0}, ["timeout", "0"]),
        ({"run_in": -1}, ["run_in", "-1"]),
    ],
    ids=[
        "priority-high",
        "priority-low",
        "naive-run_at",
        "both-delays",
        "attempts",
        "timeout",
        "run_in",
    ],
)
def test_a_new_job_with_nonsense_options_is_refused_when_made(kwargs, named) -> None:
    with pytest.raises(OptionsError) as raised:
        NewJob("Report", {"nhs": SECRET}, **kwargs)
    message = str(raised.value)
    for part in named:
        assert part in message, message
    assert "Report" in message or "run_in" in message
    assert not shows_secret(message)


def test_a_new_job_at_the_edges_of_its_options_is_accepted() -> None:
    NewJob("Report", priority=32767)
    NewJob("Report", priority=-32768, run_at=datetime(2030, 1, 1, tzinfo=timezone.utc))
    NewJob("Report", run_in=timedelta(0), max_attempts=1, timeout=0.001)


# --- no I/O until open ----------------------------------------------------------------


async def test_a_queue_made_without_a_dsn_does_no_io_and_open_reads_the_environment(
    dsn, monkeypatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("I/O before open()")

    monkeypatch.delenv("AXA_QUEUE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with monkeypatch.context() as patched:
        patched.setattr(psycopg.AsyncConnection, "connect", refuse)
        patched.setattr(psycopg.Connection, "connect", refuse)
        queue = Queue(options=QueueOptions(workers=1))
        queue.handle("Report", lambda args: None)
        queue.schedule(Schedule.every("nightly", 3600, NewJob("Report")))
        assert not queue.is_open and "closed" in repr(queue)
        with pytest.raises(axa_queue.NotOpenError, match="open"):
            await queue.enqueue("Report", {})

    with pytest.raises(OptionsError, match="AXA_QUEUE_DSN"):
        await queue.open()
    monkeypatch.setenv("AXA_QUEUE_DSN", dsn)
    await queue.open()
    try:
        assert queue.is_open
        job_id = await queue.enqueue("Report", {})
        info = await queue.job(job_id)
        assert info is not None
    finally:
        await queue.close()


# --- privacy --------------------------------------------------------------------------


def test_the_text_of_a_new_job_a_schedule_or_a_handler_leaves_out_the_arguments() -> None:
    job = NewJob("Report", {"nhs": SECRET}, priority=3)
    schedule = Schedule.every("nightly", 3600, job)
    handler = Queue().handle("Report", lambda args: None)
    for text in [repr(job), str(job), repr(schedule), str(schedule), repr(handler)]:
        assert "Report" in text, text
        assert not shows_secret(text), text


async def test_arguments_that_cannot_be_queued_are_refused_without_showing_them(
    make_queue,
) -> None:
    queue = await make_queue()
    for args in [{"nhs": SECRET, "at": object()}, {"nhs": {SECRET}}, {(SECRET,): 1}]:
        with pytest.raises(TypeError) as raised:
            await queue.enqueue("Report", args)
        assert "Report" in str(raised.value) and not shows_secret(raised.value)


@dataclasses.dataclass
class Patient:
    id: int


async def test_job_info_and_the_packages_logs_never_hold_the_arguments(
    make_queue, admin, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    queue = await make_queue(max_attempts=2)
    queue.handle("Fine", lambda args: None)

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        raise RuntimeError("the lookup failed")

    @queue.handler("Typed")
    async def typed(args: Patient) -> None:
        raise AssertionError("not run: the arguments do not fit")

    args = {"nhs": SECRET, "name": "Ann"}
    ids = [
        await queue.enqueue("Fine", args),
        await queue.enqueue("Flaky", args),
        await queue.enqueue("Typed", args),
    ]
    async with running(queue):
        await eventually(lambda: all(status_of(admin, i)[0] != "queued" for i in ids))
        await eventually(lambda: status_of(admin, ids[1])[0] == "failed")
        await eventually(lambda: status_of(admin, ids[2])[0] == "failed")
    background = await make_queue(mode="background")

    @background.handler("Flaky")
    async def in_background(args: Any) -> None:
        raise RuntimeError("the lookup failed")

    await in_background.perform_later(args)
    await background.close()

    infos = [await queue.job(i) for i in ids] + await queue.jobs()
    for info in infos:
        assert info is not None
        assert not shows_secret(repr(info))
        assert not any(shows_secret(value) for value in dataclasses.astuple(info))
    assert "2 keys" in (infos[2].error or ""), infos[2].error
    assert "nhs" not in (infos[2].error or ""), "unknown keys are arguments too: not named"

    ours = [r for r in caplog.records if r.name.startswith("axa_queue")]
    assert ours, "the package logged its work"
    assert any(getattr(r, "job_id", None) == str(ids[1]) for r in ours)
    for record in ours:
        assert not shows_secret(record.getMessage())
        for key, value in vars(record).items():
            assert not shows_secret(value), (record.getMessage(), key)


# --- the public surface ---------------------------------------------------------------

PUBLIC = [
    "MAX_REASON_CHARS",
    "NIL_JOB",
    "SETUP_STATEMENTS",
    "Act",
    "ActKind",
    "ActResult",
    "ArgumentsError",
    "Attempt",
    "AxaQueueError",
    "BulkResult",
    "ClaimLostError",
    "Composition",
    "Counts",
    "Discard",
    "DrainError",
    "DrainResult",
    "Duplicate",
    "Exponential",
    "Health",
    "JobContext",
    "JobHandler",
    "JobInfo",
    "JobNotFoundError",
    "JobState",
    "KeyCounts",
    "NewJob",
    "NoResultError",
    "NotACodeError",
    "NotInAJobError",
    "NotOpenError",
    "OptionsError",
    "Pause",
    "Queue",
    "QueueOptions",
    "Recovered",
    "Retry",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "SchemaError",
    "Sleep",
    "Snooze",
    "Step",
    "StepError",
    "SyncQueue",
    "WaitTimeoutError",
    "Workflow",
    "WorkflowInfo",
    "acts_on",
    "attempts_on",
    "backoff",
    "cancel",
    "cancel_all",
    "cancel_workflow",
    "chain",
    "chord",
    "counts_on",
    "current_job",
    "enqueue_all_on",
    "enqueue_on",
    "group",
    "job_on",
    "jobs_on",
    "name_acts_on",
    "parent_results_on",
    "pause",
    "paused_on",
    "release_all",
    "resume",
    "retry",
    "retry_all",
    "workflow_on",
]


def isort_key(name: str) -> tuple[int, str]:
    """Ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_the_public_names_are_sorted_and_pinned() -> None:
    assert axa_queue.__all__ == sorted(axa_queue.__all__, key=isort_key)
    assert axa_queue.__all__ == PUBLIC
    for name in PUBLIC:
        assert hasattr(axa_queue, name), name
    exported = {n for n in vars(axa_queue) if not n.startswith("_")}
    modules = {n for n in exported if inspect.ismodule(getattr(axa_queue, n))}
    assert exported - modules - {"annotations"} == set(PUBLIC)


def definitions(module: Path) -> dict[str, ast.AST]:
    """Top-level classes, functions and assignments of a module, by name, each with the
    string that follows an assignment (its docstring) attached as `doc`."""
    tree = ast.parse(module.read_text())
    found: dict[str, ast.AST] = {}
    body = tree.body
    for index, node in enumerate(body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            after = body[index + 1] if index + 1 < len(body) else None
            doc = (
                after.value.value
                if isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
                else None
            )
            for target in targets:
                if isinstance(target, ast.Name):
                    node.doc = doc  # type: ignore[union-attr]
                    found[target.id] = node
    return found


def source_of(name: str) -> Path:
    """The module of the package that defines the public name `name`."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 1
            and node.module
            and any(alias.name == name for alias in node.names)
        ):
            module = PACKAGE / node.module.replace(".", "/")
            return module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
    raise AssertionError(f"{name} is not imported in __init__.py")


def is_overload(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in decorators
    )


def test_every_public_name_and_its_public_methods_have_a_docstring() -> None:
    assert axa_queue.__doc__
    missing: list[str] = []
    for name in PUBLIC:
        node = definitions(source_of(name)).get(name)
        assert node is not None, f"{name} is not defined where __init__ imports it from"
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            if not getattr(node, "doc", None):
                missing.append(name)
            continue
        if not ast.get_docstring(node):  # type: ignore[arg-type]
            missing.append(name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not item.name.startswith("_")
                    and not is_overload(item)
                    and not ast.get_docstring(item)
                ):
                    missing.append(f"{name}.{item.name}")
    assert missing == []


def test_every_named_statement_is_used_by_the_package() -> None:
    statements = PACKAGE / "sql"
    others = "\n".join(
        path.read_text() for path in PACKAGE.rglob("*.py") if statements not in path.parents
    )
    unused = []
    for name, value in vars(sql).items():
        if not (name.isupper() and isinstance(value, str)):
            continue
        if value in axa_queue.SETUP_STATEMENTS:
            continue  # sent as part of SETUP_STATEMENTS
        if name in sql.__all__:
            continue  # published for users (checked below)
        if not re.search(rf"\bsql\.{name}\b|\bimport\b[^\n]*\b{name}\b", others):
            unused.append(name)
    assert unused == []


def test_the_published_channel_is_the_one_listened_on_and_notified() -> None:
    assert f"LISTEN {sql.CHANNEL}" == sql.LISTEN
    assert f"pg_notify('{sql.CHANNEL}'" in axa_queue.schema.migrations.SETUP_NOTIFY_FUNCTION


def test_every_module_of_the_package_starts_with_a_docstring() -> None:
    undocumented = [
        path.name
        for path in PACKAGE.rglob("*.py")
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert undocumented == []


async def test_log_records_of_a_job_name_it_by_id_name_and_attempt(
    make_queue, admin, caplog
) -> None:
    caplog.set_level(logging.DEBUG, logger="axa_queue")
    queue = await make_queue()

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        raise RuntimeError("no")

    job_id = await queue.enqueue("Flaky", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    failed = [r for r in caplog.records if r.getMessage().startswith("job failed")]
    assert failed, [r.getMessage() for r in caplog.records]
    record = failed[0]
    assert (record.job_id, record.job, record.attempt) == (str(job_id), "Flaky", 1)  # type: ignore[attr-defined]


async def test_a_queue_refusing_unknown_names_raises_naming_the_name_and_queues_nothing(
    make_queue, admin
) -> None:
    queue = await make_queue(unknown_names="refuse")
    queue.handle("Known", lambda args: None)
    with pytest.raises(OptionsError) as raised:
        await queue.enqueue("Knwon2", {"nhs": SECRET})
    message = str(raised.value)
    assert "'Knwon2'" in message and 'unknown_names="accept"' in message
    assert "@queue.handler('Knwon2')" in message and SECRET not in message
    with pytest.raises(OptionsError, match="Knwon2"):
        await queue.enqueue_all([NewJob("Known", {}), NewJob("Knwon2", {})])
    sync = queue.sync()
    try:
        with pytest.raises(OptionsError, match="Knwon2"):
            sync.enqueue("Knwon2", {})
        with pytest.raises(OptionsError, match="Knwon2"):
            sync.enqueue_all([NewJob("Knwon2", {})])
    finally:
        sync.close()
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    await queue.enqueue("Known", {})
    assert admin.execute("SELECT name FROM axa_queue").fetchall() == [("Known",)]


async def test_by_default_a_queue_accepts_a_name_it_has_no_handler_for(make_queue, admin) -> None:
    queue = await make_queue()
    await queue.enqueue("Elsewhere", {})
    await queue.enqueue_all([NewJob("Elsewhere", {})])
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (2,)
