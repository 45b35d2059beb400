"""Typed handlers: dataclass arguments, `perform_later` in each mode, sync handlers in
threads, and failures of every kind kept to their own attempt."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Optional
from uuid import UUID, uuid4

import psycopg
import pytest

from axa_queue import JobContext, NewJob, OptionsError, Queue, current_job
from conftest import eventually, running, status_of

SECRET = "943 476 5919"
"""What must never leave the `args` column."""


@dataclass
class Report:
    id: int
    title: str = "monthly"


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Size(int, Enum):
    SMALL = 1
    LARGE = 2


@dataclass
class Line:
    sku: UUID
    price: Decimal
    colour: Colour = Colour.RED


@dataclass
class Invoice:
    id: int
    issued: date
    due: datetime
    total: Decimal
    ref: UUID
    colour: Colour
    size: Size
    lines: list[Line]
    owner: Optional[Report] = None  # noqa: UP045 - the typing spelling is checked too
    note: str | None = None
    ratio: float = 1.0
    tags: dict[str, int] = field(default_factory=dict)
    pair: tuple[int, str] = (0, "")
    extra: Any = None


class Halt(BaseException):
    """A BaseException of the job's own, not an Exception."""


def rows(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM axa_queue").fetchone()
    assert row is not None
    return int(row[0])


def updated_at(admin: psycopg.Connection[Any], job_id: UUID) -> datetime:
    row = admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


async def test_a_handler_annotated_with_a_dataclass_receives_an_instance(make_queue, admin) -> None:
    queue = await make_queue()
    got: list[Any] = []

    @queue.handler("Report")
    async def report(args: Report) -> None:
        got.append(args)

    job_id = await report.perform_later(Report(7, "weekly"))
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert got == [Report(7, "weekly")]


async def test_perform_later_queues_a_row_with_its_options_by_default(make_queue, admin) -> None:
    queue = await make_queue()
    assert queue.options.mode is None

    @queue.handler("Report")
    async def report(args: Report) -> None:
        raise AssertionError("not run: nothing works the queue here")

    job_id = await report.perform_later(Report(7), priority=3, max_attempts=2, run_in=60)
    assert isinstance(job_id, UUID)
    row = admin.execute(
        "SELECT name, args, priority, max_attempts, status, attempts, run_at - created_at, "
        "timeout_ms FROM axa_queue WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == (
        "Report",
        {"id": 7, "title": "monthly"},
        3,
        2,
        "queued",
        0,
        timedelta(seconds=60),
        None,
    )

    at = datetime.now(timezone.utc) + timedelta(hours=2)
    other = await report.perform_later(Report(8), run_at=at, timeout=1.5)
    row = admin.execute(
        "SELECT run_at, timeout_ms, priority, max_attempts FROM axa_queue WHERE id = %s",
        (other,),
    ).fetchone()
    assert row == (at, 1500, 0, None)


@pytest.mark.parametrize("how", ["option", "environment"])
async def test_inline_mode_runs_the_handler_now_in_the_caller_and_queues_nothing(
    make_queue, admin, monkeypatch, how
) -> None:
    if how == "option":
        monkeypatch.delenv("AXA_QUEUE_MODE", raising=False)
        queue = await make_queue(mode="inline")
    else:
        monkeypatch.setenv("AXA_QUEUE_MODE", "inline")
        queue = await make_queue()
        assert queue.options.mode is None
    caller = asyncio.current_task()
    got: list[tuple[Any, Any]] = []

    contexts: list[JobContext] = []

    @queue.handler("Report")
    async def report(args: Report) -> None:
        got.append((args, asyncio.current_task()))
        contexts.append(current_job())
        if args.id < 0:
            raise ValueError("no negative reports")

    run_id = await report.perform_later(Report(1), priority=5, max_attempts=3)
    assert got == [(Report(1), caller)]
    assert contexts == [JobContext(run_id, "Report", 1, 3)], "the id returned is the run's"
    with pytest.raises(ValueError, match="no negative reports"):
        await report.perform_later(Report(-1))
    assert rows(admin) == 0


async def test_an_unknown_mode_in_the_environment_is_refused_by_name(
    make_queue, monkeypatch
) -> None:
    monkeypatch.setenv("AXA_QUEUE_MODE", "later")
    queue = await make_queue()
    report = queue.handle("Report", lambda args: None)
    with pytest.raises(OptionsError, match=r"AXA_QUEUE_MODE.*'later'"):
        await report.perform_later({})


async def test_background_mode_runs_the_handler_as_a_task_here_and_queues_nothing(
    make_queue, admin, monkeypatch
) -> None:
    monkeypatch.setenv("AXA_QUEUE_MODE", "queue")  # the option wins over the variable
    queue = await make_queue(mode="background")
    caller = asyncio.current_task()
    ran = asyncio.Event()
    got: list[tuple[Any, Any]] = []

    @queue.handler("Report")
    async def report(args: Report) -> None:
        got.append((args, asyncio.current_task()))
        if args.id < 0:
            raise ValueError("told to fail")
        ran.set()

    assert isinstance(await report.perform_later(Report(-1)), UUID), "a failure is not raised"
    assert isinstance(await report.perform_later(Report(2)), UUID)
    await asyncio.wait_for(ran.wait(), 10)
    assert got[-1][0] == Report(2) and got[-1][1] is not caller
    assert rows(admin) == 0


async def test_a_handler_taking_a_plain_dict_gets_the_stored_json(make_queue, admin) -> None:
    queue = await make_queue()
    got: list[Any] = []

    @queue.handler("Plain")
    async def plain(args: dict[str, Any]) -> None:
        got.append(args)

    queue.handle("Bare", lambda args: got.append(args))
    first = await plain.perform_later({"id": 1, "tags": ["a", "b"], "nested": {"x": None}})
    second = await queue.enqueue("Bare", [1, 2, 3])
    async with running(queue):
        await eventually(
            lambda: status_of(admin, first)[0] == status_of(admin, second)[0] == "completed"
        )
    assert sorted(got, key=str) == sorted(
        [{"id": 1, "tags": ["a", "b"], "nested": {"x": None}}, [1, 2, 3]], key=str
    )


async def test_a_sync_handler_runs_in_a_worker_thread(make_queue, admin) -> None:
    queue = await make_queue()
    threads: list[threading.Thread] = []

    @queue.handler("Sync")
    def sync(args: Report) -> None:
        assert isinstance(args, Report)
        threads.append(threading.current_thread())

    job_id = await sync.perform_later(Report(1))
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert len(threads) == 1 and threads[0] is not threading.main_thread()


async def test_a_sync_handler_hogging_the_cpu_does_not_stop_heartbeats(make_queue, admin) -> None:
    queue = await make_queue(heartbeat_interval=0.1)
    started = threading.Event()
    release = threading.Event()

    @queue.handler("Busy")
    def busy(args: Any) -> None:
        started.set()
        give_up = time.monotonic() + 20
        while not release.is_set() and time.monotonic() < give_up:
            sum(range(2000))  # CPU work, holding the GIL in turns

    job_id = await queue.enqueue("Busy", {})
    try:
        async with running(queue):
            await eventually(started.is_set)
            for _ in range(3):  # three heartbeats while it runs
                before = updated_at(admin, job_id)
                await eventually(lambda: updated_at(admin, job_id) > before, timeout=5)  # noqa: B023
                assert status_of(admin, job_id)[0] == "running"
            release.set()
            await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    finally:
        release.set()
    assert status_of(admin, job_id) == ("completed", None, 1)


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit(3), "SystemExit: 3"),
        (Halt("halt"), "Halt: halt"),
    ],
    ids=["KeyboardInterrupt", "SystemExit", "custom"],
)
async def test_a_handler_raising_a_base_exception_fails_its_attempt_and_the_worker_goes_on(
    make_queue, admin, kind, raised, text
) -> None:
    queue = await make_queue(workers=1)

    if kind == "async":

        async def bad(args: Any) -> None:
            raise raised

    else:

        def bad(args: Any) -> None:
            raise raised

    queue.handle("Bad", bad)
    queue.handle("Fine", lambda args: None)
    bad_id = await queue.enqueue("Bad", {}, priority=1)
    fine_id = await queue.enqueue("Fine", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, fine_id)[0] == "completed")
    assert status_of(admin, bad_id) == ("failed", text, 1)


async def test_a_failure_whose_text_cannot_be_stored_as_is_fails_only_its_job(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Files")
    async def files(args: Any) -> None:
        raise RuntimeError("cannot read /data/\udcff.csv")  # a surrogate-escaped name

    queue.handle("Fine", lambda args: None)
    bad_id = await queue.enqueue("Files", {})
    fine_id = await queue.enqueue("Fine", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, bad_id)[0] == "failed")
        await eventually(lambda: status_of(admin, fine_id)[0] == "completed")
        later = await queue.enqueue("Fine", {})
        await eventually(lambda: status_of(admin, later)[0] == "completed")
    assert status_of(admin, bad_id)[1] == "RuntimeError: cannot read /data/?.csv"


async def test_a_failure_text_with_a_nul_character_fails_only_its_job(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("Binary")
    async def binary(args: Any) -> None:
        raise ValueError("bad header \x00 at byte 3")  # PostgreSQL text cannot hold NUL

    queue.handle("Fine", lambda args: None)
    bad_id = await queue.enqueue("Binary", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, bad_id)[0] == "failed")
        later = await queue.enqueue("Fine", {})
        await eventually(lambda: status_of(admin, later)[0] == "completed")
    assert status_of(admin, bad_id)[1] == "ValueError: bad header ? at byte 3"


@pytest.mark.parametrize(
    ("stored", "text"),
    [
        ({"id": 1, "colour_of_" + SECRET: "red"}, "1 key that Report does not declare"),
        ({"title": "x"}, "Report needs field 'id', which was not given"),
        ({"id": SECRET}, "field 'id' expects int, got a JSON string"),
        ([1, 2], "expects a JSON object for Report, got a JSON array"),
        ("7", "expects a JSON object for Report, got a JSON string"),
        (None, "expects a JSON object for Report, got a JSON null"),
    ],
    ids=["unknown-field", "missing-field", "wrong-type", "array", "string", "null"],
)
async def test_stored_arguments_that_do_not_fit_the_dataclass_fail_the_job(
    make_queue, admin, stored, text
) -> None:
    queue = await make_queue()
    called: list[Any] = []

    @queue.handler("Report")
    async def report(args: Report) -> None:
        called.append(args)

    job_id = await queue.enqueue(NewJob("Report", stored))
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    error = status_of(admin, job_id)[1]
    assert error is not None and error.startswith("TypeError: ") and text in error, error
    assert SECRET not in error and "colour" not in error
    assert called == []


INVOICE = Invoice(
    id=7,
    issued=date(2026, 12, 1),
    due=datetime(2026, 12, 31, 17, 30, 0, 250, tzinfo=timezone(timedelta(hours=-5))),
    total=Decimal("1234.5600"),
    ref=uuid4(),
    colour=Colour.BLUE,
    size=Size.LARGE,
    lines=[Line(uuid4(), Decimal("0.10")), Line(uuid4(), Decimal("-3"), Colour.BLUE)],
    owner=Report(3, "weekly"),
    note=None,
    ratio=2,  # type: ignore[arg-type]  # an int where a float is declared: read back as 2.0
    tags={"a": 1},
    pair=(1, "x"),
    extra={"free": ["form"]},
)


async def test_dates_times_decimals_uuids_and_enums_of_a_typed_handler_round_trip(
    make_queue, admin
) -> None:
    queue = await make_queue()
    got: list[Invoice] = []

    @queue.handler("Invoice")
    def invoice(args: Invoice) -> None:
        got.append(args)

    job_id = await invoice.perform_later(INVOICE)
    row = admin.execute("SELECT args FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    stored = row[0]
    assert stored["issued"] == "2026-12-01" and stored["total"] == "1234.5600"
    assert stored["due"] == "2026-12-31T17:30:00.000250-05:00"
    assert stored["colour"] == "blue" and stored["size"] == 2 and stored["ref"] == str(INVOICE.ref)
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert got == [INVOICE]
    assert isinstance(got[0].ratio, float) and isinstance(got[0].pair, tuple)
    assert type(got[0].lines[0].price) is Decimal and got[0].due.utcoffset() is not None


async def test_a_typed_handler_round_trips_in_inline_mode_too(make_queue) -> None:
    queue = await make_queue(mode="inline")
    got: list[Invoice] = []

    @queue.handler("Invoice")
    async def invoice(args: Invoice) -> None:
        got.append(args)

    await invoice.perform_later(INVOICE)
    assert got == [INVOICE]


def decode_error(stored: Any) -> str:
    handler = Queue().handle("Invoice", lambda args: None)
    handler.argument_type = Invoice
    with pytest.raises(TypeError) as raised:
        handler.decode(stored)
    return str(raised.value)


def changed(path: str, value: Any) -> dict[str, Any]:
    """The stored arguments of INVOICE with the value at the dotted `path` replaced."""
    stored = json.loads(NewJob("Invoice", INVOICE).encoded_args())
    *parents, last = path.split(".")
    target: Any = stored
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    return stored


@pytest.mark.parametrize(
    ("path", "value", "text"),
    [
        ("id", SECRET, "field 'id' expects int, got a JSON string"),
        ("id", True, "field 'id' expects int, got a JSON boolean"),
        ("id", 7.5, "field 'id' expects int, got a JSON number"),
        ("ratio", SECRET, "field 'ratio' expects float, got a JSON string"),
        ("note", 5, "field 'note' expects str | None, got a JSON number"),
        ("issued", SECRET, "field 'issued' expects date (ISO 8601 text)"),
        ("due", 5, "field 'due' expects datetime, got a JSON number"),
        ("total", SECRET, "field 'total' expects Decimal (its text)"),
        ("ref", SECRET, "field 'ref' expects UUID (its text)"),
        ("colour", SECRET, "field 'colour' expects one of the values of Colour"),
        ("size", 3, "field 'size' expects one of the values of Size"),
        ("lines", {"a": 1}, "field 'lines' expects list[Line], got a JSON object"),
        ("lines.1.price", [SECRET], "field 'lines[1].price' expects Decimal, got a JSON array"),
        ("owner", SECRET, "field 'owner' expects Report | None, got a JSON string"),
        ("owner.id", SECRET, "field 'owner.id' expects int, got a JSON string"),
        ("tags", [SECRET], "field 'tags' expects dict[str, int], got a JSON array"),
        ("tags.a", SECRET, "field 'tags[*]' expects int, got a JSON string"),
        ("pair", [1, SECRET, 3], "field 'pair' expects tuple[int, str], got a JSON array of 3"),
    ],
)
def test_a_stored_value_of_the_wrong_type_fails_naming_the_field_and_type_not_the_value(
    path: str, value: Any, text: str
) -> None:
    message = decode_error(changed(path, value))
    assert message.startswith("job 'Invoice': ") and text in message, message
    assert SECRET not in message


def test_unknown_keys_fail_without_being_named_and_missing_fields_are_named() -> None:
    stored = changed("owner", {"id": 1, "secret_" + SECRET: 1, "other": 2})
    message = decode_error(stored)
    assert "field 'owner' was given 2 keys that Report does not declare" in message, message
    assert "secret" not in message and "other" not in message
    del stored["owner"]
    del stored["issued"]
    assert "Invoice needs field 'issued', which was not given" in decode_error(stored)


def test_a_renamed_field_fails_naming_every_missing_field_and_counting_the_unknown_key() -> None:
    stored = changed("owner", {"title": "x", "id_" + SECRET: 1})
    del stored["issued"], stored["total"]
    assert decode_error(stored) == (
        "job 'Invoice': Invoice needs fields 'issued', 'total', which were not given"
    )
    assert decode_error(changed("owner", {"title": "x", "id_" + SECRET: 1})) == (
        "job 'Invoice': Report needs field 'owner.id', which was not given; field 'owner' "
        "was given 1 key that Report does not declare (not named here: keys are arguments too)"
    )


def test_a_plain_handler_gets_iso_text_only_if_it_was_converted_by_the_caller() -> None:
    with pytest.raises(OptionsError, match="pass the arguments as a dataclass"):
        NewJob("Invoice", {"issued": date(2026, 12, 1)})
    NewJob("Invoice", {"issued": date(2026, 12, 1).isoformat()})
