"""Bad inputs: every name, argument, time, length and id the queue cannot store or find
is refused in Python, before any SQL, with a message that names the job (or option,
or id) and the problem, and never a job's arguments (their keys included)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import logging
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import axa_queue
from axa_queue import (
    NewJob,
    OptionsError,
    Queue,
    QueueOptions,
    Schedule,
    ScheduleError,
    SyncQueue,
    acts_on,
    cancel,
    enqueue_all_on,
    enqueue_on,
    job_on,
    retry,
)
from axa_queue.cli import main
from axa_queue.handlers.retries import describe, first_line
from axa_queue.jobs.model import LATEST_RUN_AT, MAX_ARGS_DEPTH, MAX_NAME_CHARS
from axa_queue.options import MAX_DURATION
from conftest import eventually, running, set_up, status_of

SECRET = "943 476 5919"
"""What must never leave the `args` column."""
KEY = "nhs_number_of_the_patient"
"""A key of the arguments: keys are arguments too."""


def deep(levels: int) -> Any:
    value: Any = SECRET
    for _ in range(levels):
        value = [value]
    return value


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Note:
    text: str


BAD_NAMES = {
    "empty": "",
    "blank": "   ",
    "nul": "Rep\x00ort",
    "lone-surrogate": "Rep\udc80ort",
    "too-long": "R" * (MAX_NAME_CHARS + 1),
}

BAD_ARGS: dict[str, tuple[Any, str]] = {
    "nul-in-value": ({KEY: SECRET + "\x00"}, "NUL"),
    "nul-in-key": ({KEY + "\x00": SECRET}, "NUL"),
    "surrogate-in-value": ({KEY: [1, {"a": SECRET + "\udc80"}]}, "surrogate"),
    "surrogate-in-key": ({KEY + "\ud800": SECRET}, "surrogate"),
    "nul-in-a-dataclass": (Note(SECRET + "\x00"), "NUL"),
    "nested-10000-deep": (deep(10_000), "deeper"),
    "self-containing": (None, "deeper"),
    "nan": ({KEY: float("nan")}, "NaN"),
    "decimal": ({KEY: Decimal("1.5")}, "Decimal"),
    "date": ({KEY: date(2030, 1, 1)}, "date"),
    "uuid": ({KEY: UUID(int=5)}, "UUID"),
    "enum": ({KEY: Colour.RED}, "Colour"),
    "set": ({KEY: {SECRET}}, "set"),
    "bytes-key": ({KEY.encode(): SECRET}, "bytes"),
}


def bad_args(case: str) -> Any:
    if case == "self-containing":
        loop: list[Any] = [SECRET]
        loop.append(loop)
        return loop
    return BAD_ARGS[case][0]


def assert_private(message: str) -> None:
    assert SECRET not in message and SECRET.replace(" ", "") not in message, message
    assert KEY not in message, message


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_job_name_postgresql_cannot_store_or_too_long_is_refused_where_it_is_given(
    name: str,
) -> None:
    queue = Queue()
    attempts: list[Callable[[], object]] = [
        lambda: NewJob(name, {KEY: SECRET}),
        lambda: queue.handle(name, lambda args: None),
        lambda: queue.handler(name)(lambda args: None),
        lambda: Schedule.every("nightly", 60, NewJob(name)),
    ]
    for attempt in attempts:
        with pytest.raises(OptionsError) as raised:
            attempt()
        message = str(raised.value)
        assert "name" in message, message
        assert len(message) < 400, message  # a 201-character name is not printed whole
        assert_private(message)
    assert queue.handlers == {}


@pytest.mark.parametrize("name", ["Rep\x00ort", "Rep\udc80ort", "s" * 201, ""])
def test_a_schedule_name_postgresql_cannot_store_or_too_long_is_refused(name: str) -> None:
    with pytest.raises(ScheduleError, match="schedule name"):
        Schedule.every(name, 60, NewJob("Report"))


async def test_a_name_of_the_longest_length_is_queued_and_read_back(make_queue) -> None:
    queue = await make_queue()
    name = "R" + "é" * (MAX_NAME_CHARS - 1)
    queue.handle(name, lambda args: None)
    job_id = await queue.enqueue(name, {})
    info = await queue.job(job_id)
    assert info is not None and info.name == name


# --- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD_ARGS.keys())
def test_arguments_that_cannot_be_stored_are_refused_naming_the_job_and_not_the_value(
    case: str,
) -> None:
    with pytest.raises(OptionsError) as raised:
        NewJob("Report", bad_args(case))
    assert isinstance(raised.value, TypeError)  # as before: arguments of the wrong kind
    message = str(raised.value)
    assert "'Report'" in message and BAD_ARGS[case][1] in message, message
    assert_private(message)
    assert raised.value.__cause__ is None and raised.value.__context__ is None


def test_arguments_nested_to_the_limit_are_accepted_and_one_more_level_is_refused() -> None:
    NewJob("Report", deep(MAX_ARGS_DEPTH))
    with pytest.raises(OptionsError, match=f"deeper than {MAX_ARGS_DEPTH}"):
        NewJob("Report", deep(MAX_ARGS_DEPTH + 1))


def test_a_plain_dict_holding_a_decimal_is_told_to_use_a_dataclass_or_convert() -> None:
    with pytest.raises(OptionsError) as raised:
        NewJob("Report", {KEY: Decimal("9.99")})
    assert "dataclass" in str(raised.value) and "convert" in str(raised.value)


@pytest.mark.parametrize("case", ["nul-in-value", "surrogate-in-key", "nested-10000-deep"])
def test_bad_arguments_are_refused_by_every_way_of_queuing_before_any_sql(
    dsn, admin, case: str
) -> None:
    set_up(admin)
    args = bad_args(case)
    with psycopg.connect(dsn) as conn:  # in a transaction, that a statement would abort
        with pytest.raises(OptionsError):
            enqueue_on(conn, NewJob("Report", args))
        with pytest.raises(OptionsError):
            enqueue_all_on(conn, [NewJob("Fine"), NewJob("Report", args)])
        assert conn.info.transaction_status is not psycopg.pq.TransactionStatus.INERROR
        enqueue_on(conn, NewJob("Fine"))  # the caller's transaction goes on
        conn.commit()
    with SyncQueue(dsn) as jobs, pytest.raises(OptionsError):
        jobs.enqueue("Report", args)
    row = admin.execute("SELECT array_agg(name) FROM axa_queue").fetchone()
    assert row == (["Fine"],)


async def test_bad_arguments_are_refused_by_the_queue_and_perform_later(make_queue, admin) -> None:
    queue = await make_queue()
    handler = queue.handle("Report", lambda args: None)
    args = bad_args("nul-in-value")
    for attempt in [
        lambda: queue.enqueue("Report", args),
        lambda: queue.enqueue_all([NewJob("Report", args)]),
        lambda: handler.perform_later(args),
    ]:
        with pytest.raises(OptionsError) as raised:
            await attempt()
        assert_private(str(raised.value))
    row = admin.execute("SELECT count(*) FROM axa_queue").fetchone()
    assert row == (0,)


def test_a_schedule_whose_arguments_cannot_be_stored_is_refused_when_made() -> None:
    with pytest.raises(OptionsError) as raised:
        Schedule.every("nightly", 3600, NewJob("Report", {KEY: [Decimal(1)]}))
    assert "'Report'" in str(raised.value) and "Decimal" in str(raised.value)
    assert_private(str(raised.value))
    with pytest.raises(OptionsError):
        Schedule("nightly", timedelta(hours=1), NewJob("Report", {KEY: [SECRET + "\x00"]}))


def test_a_new_job_is_encoded_once_when_made_and_later_changes_to_its_args_are_not_seen() -> None:
    args: dict[str, Any] = {KEY: []}
    job = NewJob("Report", args)
    schedule = Schedule.every("nightly", 3600, job)
    args[KEY].append(Decimal(1))  # not JSON, but too late to matter
    assert json.loads(schedule.job.encoded_args()) == json.loads(job.encoded_args()) == {KEY: []}
    assert "_args_json" not in repr(job) and SECRET not in repr(NewJob("R", {KEY: SECRET}))


# --- times and lengths ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(9999, 12, 31, 12, 0, tzinfo=timezone(timedelta(hours=-5))),
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone.utc),
        datetime(1, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=5))),
        datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc),
    ],
    ids=["9999-minus-five", "9999-utc", "year-1", "before-1970"],
)
def test_a_run_at_past_the_bounds_is_refused_naming_them(run_at: datetime) -> None:
    with pytest.raises(OptionsError) as raised:
        NewJob("Report", run_at=run_at)
    message = str(raised.value)
    assert "run_at" in message and "1970" in message and str(LATEST_RUN_AT.year) in message


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "Pacific/Kiritimati", "Pacific/Pago_Pago", "UTC"])
async def test_a_run_at_at_the_bounds_reads_back_in_any_session_time_zone(
    make_queue, dsn, zone: str
) -> None:
    queue = await make_queue()
    latest = LATEST_RUN_AT - timedelta(microseconds=1)
    earliest = datetime(1970, 1, 1, tzinfo=timezone.utc)
    ids = await queue.enqueue_all(
        [NewJob("Report", run_at=latest), NewJob("Report", run_at=earliest)]
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('TimeZone', %s, false)", (zone,))
        infos = [job_on(conn, job_id) for job_id in ids]
    assert [info.run_at for info in infos if info] == [latest, earliest]
    assert infos[0] is not None and infos[0].run_at.tzinfo is not None
    assert ZoneInfo(zone)


@pytest.mark.parametrize("option", ["run_in", "timeout"])
@pytest.mark.parametrize(
    "value",
    [1e300, 1e13, float("inf"), MAX_DURATION + timedelta(seconds=1), timedelta.max],
    ids=["1e300", "1e13", "inf", "just-over", "timedelta-max"],
)
def test_a_job_duration_past_the_bound_is_refused_naming_the_option_and_the_bound(
    option: str, value: Any
) -> None:
    with pytest.raises(OptionsError) as raised:
        NewJob("Report", **{option: value})
    message = str(raised.value)
    assert option in message and ("100 years" in message or "finite" in message), message


@pytest.mark.parametrize("value", [1e300, -1, float("nan"), MAX_DURATION * 2])
def test_a_schedule_interval_or_a_queue_duration_past_the_bound_is_refused(value: Any) -> None:
    with pytest.raises(ScheduleError, match="interval"):
        Schedule.every("nightly", value, NewJob("Report"))
    with pytest.raises(OptionsError, match="retention"):
        QueueOptions(retention=value)


async def test_durations_at_the_bound_are_queued_and_read_back(make_queue) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {}, run_in=MAX_DURATION, timeout=MAX_DURATION)
    info = await queue.job(job_id)
    assert info is not None and info.timeout == MAX_DURATION
    Schedule.every("nightly", MAX_DURATION, NewJob("Report"))
    QueueOptions(retention=MAX_DURATION)


# --- ids ---------------------------------------------------------------------------------


BAD_IDS = ["not-a-uuid", 42, "", None, b"\x00" * 16]


def test_a_malformed_id_is_refused_naming_it_and_the_transaction_goes_on(dsn, admin) -> None:
    set_up(admin)
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # a transaction is open, that a refused id would abort
        for bad in BAD_IDS:
            for attempt in [
                lambda bad=bad: cancel(conn, bad, "ops", "asked"),  # type: ignore[arg-type]
                lambda bad=bad: retry(conn, bad, "ops", "asked"),  # type: ignore[arg-type]
                lambda bad=bad: job_on(conn, bad),  # type: ignore[arg-type]
                lambda bad=bad: acts_on(conn, bad),  # type: ignore[arg-type]
            ]:
                with pytest.raises(OptionsError) as raised:
                    attempt()
                assert "job id" in str(raised.value) and repr(bad)[:20] in str(raised.value)
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    with SyncQueue(dsn) as jobs:
        for bad in BAD_IDS:
            with pytest.raises(OptionsError, match="job id"):
                jobs.job(bad)  # type: ignore[arg-type]
            with pytest.raises(OptionsError, match="job id"):
                jobs.acts(bad)  # type: ignore[arg-type]
        job_id = jobs.enqueue("Report")
        assert jobs.job(str(job_id)) is not None  # type: ignore[arg-type]


async def test_a_malformed_id_is_refused_by_the_queue(make_queue) -> None:
    queue = await make_queue()
    for bad in BAD_IDS:
        with pytest.raises(OptionsError, match="job id"):
            await queue.job(bad)  # type: ignore[arg-type]
        with pytest.raises(OptionsError, match="job id"):
            await queue.acts(bad)  # type: ignore[arg-type]
    assert await queue.job(str(uuid4())) is None


# --- handlers registered twice -----------------------------------------------------------


def test_a_handler_name_registered_twice_is_refused_unless_replace_is_asked() -> None:
    queue = Queue()
    first = queue.handle("Report", lambda args: "first")
    with pytest.raises(OptionsError, match=r"'Report'.*replace=True"):
        queue.handle("Report", lambda args: "second")
    with pytest.raises(OptionsError, match="replace=True"):

        @queue.handler("Report")
        def again(args: Any) -> None: ...

    assert queue.handlers["Report"] is first
    second = queue.handle("Report", lambda args: "second", replace=True)
    assert queue.handlers["Report"] is second

    @queue.handler("Report", replace=True)
    def third(args: Any) -> str:
        return "third"

    assert queue.handlers["Report"] is third


# --- database diagnostics ------------------------------------------------------------------


def test_a_database_errors_detail_and_context_are_not_kept_nor_logged(admin) -> None:
    text = json.dumps({KEY: SECRET}).replace('"}', '\\u0000"}')
    with pytest.raises(psycopg.Error) as raised:
        admin.execute("SELECT %s::jsonb", (text,))
    assert SECRET in str(raised.value)  # what psycopg says: the data is in its CONTEXT
    for told in [describe(raised.value), first_line(raised.value)]:
        assert "unsupported Unicode escape sequence" in told, told
        assert_private(told)
        assert "CONTEXT" not in told and "DETAIL" not in told


async def test_a_handlers_database_error_is_kept_and_logged_without_the_data_it_quotes(
    make_queue, admin, dsn, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    queue = await make_queue()

    @queue.handler("Import")
    async def load(args: dict[str, Any]) -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("SELECT %s::jsonb", (args["raw"],))

    job_id = await queue.enqueue("Import", {"raw": '{"' + KEY + '": "' + SECRET + '\\u0000"}'})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    error = status_of(admin, job_id)[1]
    assert error == "UntranslatableCharacter: unsupported Unicode escape sequence", error
    assert_private(caplog.text)
    assert_private(" ".join(str(record.__dict__) for record in caplog.records))


def test_no_log_record_of_the_package_carries_an_errors_whole_text() -> None:
    package = Path(axa_queue.__file__).parent
    for module in package.glob("*.py"):
        text = module.read_text()
        assert not re.search(r"\"error\":\s*str\(", text), module.name  # DETAIL, CONTEXT


# --- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["Report", "--args", "[" * 10_000 + "1" + "]" * 10_000], "deep"),
        (["Report", "--args", json.dumps({KEY: SECRET + "\x00"})], "NUL"),
        (["Report", "--args", json.dumps({KEY: SECRET + "\udc80"})], "surrogate"),
        (["R" * 201], "name"),
        (["Report", "--run-in", "1e300"], "run_in"),
        (["Report", "--timeout", "1e13"], "timeout"),
        (["Report", "--run-at", "9999-12-31T20:00:00-05:00"], "run_at"),
    ],
    ids=["deep", "nul", "surrogate", "long-name", "run-in", "timeout", "run-at"],
)
def test_the_cli_refuses_what_cannot_be_queued_in_one_line_with_status_2(
    arguments: list[str], named: str
) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": "postgresql://nobody@127.0.0.1:1/none"})
    result = runner.invoke(main, ["enqueue", *arguments], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert named in lines[0], lines[0]
    assert_private(result.output)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (
            f'queue.schedule(Schedule.every("s", 60, NewJob("Report", {{"{KEY}": Decimal(1)}})))',
            "Decimal",
        ),
        (
            f'queue.schedule(Schedule.every("s", 60, NewJob("Report", {{"{KEY}": "{SECRET}\\x00"}})))',
            "NUL",
        ),
        ('queue.schedule(Schedule.every("s\\x00", 60, NewJob("Report")))', "schedule name"),
        ('queue.handle("Rep\\x00ort", print)', "job name"),
    ],
    ids=["decimal-args", "nul-args", "nul-schedule-name", "nul-handler-name"],
)
def test_a_worker_module_with_a_schedule_or_handler_that_cannot_be_stored_stops_at_boot(
    tmp_path, monkeypatch, line: str, named: str
) -> None:
    module = f"bad_{uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from decimal import Decimal\n"
        "from axa_queue import NewJob, Queue, Schedule\n\n"
        f"queue = Queue()\n{line}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner(env={"AXA_QUEUE_DSN": "postgresql://nobody@127.0.0.1:1/none"})
    result = runner.invoke(main, ["worker", f"{module}:queue"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"importing '{module}' failed" in lines[0] and named in lines[0], lines[0]
    assert_private(result.output)


_STORABLE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _STORABLE_TEXT,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_STORABLE_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_arguments_are_encoded_as_json_dumps_encodes_them(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert NewJob("Encoded", value).encoded_args() == expected


def test_newjob_takes_its_fields_as_a_dataclass_would() -> None:
    """`NewJob.__init__` is written by hand (cheaper than the frozen dataclass's): it
    takes every init field, in order, with the field's default."""
    parameters = list(inspect.signature(NewJob).parameters.values())
    fields = [f for f in dataclasses.fields(NewJob) if f.init]
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, found in zip(parameters, fields, strict=True):
        if found.default_factory is not dataclasses.MISSING:
            assert NewJob("Defaults").args == found.default_factory() == {}
        elif found.default is dataclasses.MISSING:
            assert parameter.default is inspect.Parameter.empty
        else:
            assert parameter.default == found.default
    assert NewJob("Defaults").args is not NewJob("Defaults").args
    assert dataclasses.replace(NewJob("Defaults"), priority=2) == NewJob("Defaults", priority=2)
    for _ in range(2):  # a name refused is refused again; one taken is taken again
        with pytest.raises(OptionsError, match="cannot be used"):
            NewJob(" ")
        assert NewJob("Defaults").name == "Defaults"
