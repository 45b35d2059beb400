"""Pydantic models as job arguments: queued as their JSON form (at the top, nested, one
by one and in bulk), handed back to a handler annotated with the model, and every
failure said by field and type, never by value; pydantic is never imported for a user
who does not use it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import date
from typing import Any
from uuid import UUID

import psycopg
import pytest

pydantic = pytest.importorskip("pydantic")

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_serializer, field_validator  # noqa: E402
from pydantic.dataclasses import dataclass as pydantic_dataclass  # noqa: E402

from axa_queue import ArgumentsError, JobState, NewJob  # noqa: E402
from axa_queue.jobs.arguments import result_json  # noqa: E402
from axa_queue.jobs.enqueue import copies  # noqa: E402
from axa_queue.testing import assert_enqueued  # noqa: E402
from conftest import running  # noqa: E402

SECRET = "943 476 5919"
"""What must never leave the `args` column."""


class Line(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    issued: date
    lines: list[Line] = []
    tags: dict[str, int] = {}
    ref: str = Field(default="", alias="Ref")

    @field_validator("ref")
    @classmethod
    def _no_bad_refs(cls, ref: str) -> str:
        if ref.startswith("bad"):
            raise ValueError(f"a bad ref: {ref}")  # pydantic's text would quote it
        return ref


ORDER = Order(id=7, issued=date(2026, 12, 1), lines=[Line(sku="A-1", qty=2)], Ref="po-9")
STORED_ORDER = {
    "id": 7,
    "issued": "2026-12-01",
    "lines": [{"sku": "A-1", "qty": 2}],
    "tags": {},
    "Ref": "po-9",
}
"""ORDER as the `args` column holds it: its JSON form, keyed by its aliases."""


@dataclass
class Shipment:
    order: Order
    returned: Order | None = None
    weight: int = 0


def stored_args(admin: psycopg.Connection[Any], job_id: UUID) -> Any:
    row = admin.execute("SELECT args FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


async def test_a_model_is_queued_as_its_json_and_a_typed_handler_receives_an_equal_model(
    make_queue, admin
) -> None:
    queue = await make_queue()
    got: list[Order] = []

    @queue.handler("Order")
    async def order(args: Order) -> None:
        got.append(args)

    job_id = await order.perform_later(ORDER)
    assert stored_args(admin, job_id) == STORED_ORDER
    await assert_enqueued(queue, "Order", args=ORDER)
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert info.state is JobState.COMPLETED
    assert got == [ORDER] and type(got[0]) is Order and type(got[0].lines[0]) is Line


async def test_models_inside_dicts_lists_and_dataclasses_are_queued_and_handed_back_as_models(
    make_queue, admin
) -> None:
    queue = await make_queue()
    got: list[Shipment] = []

    @queue.handler("Ship")
    def ship(args: Shipment) -> None:
        got.append(args)

    nested = await queue.enqueue("Mixed", {"orders": [ORDER, (ORDER,)], "one": Shipment(ORDER)})
    assert stored_args(admin, nested) == {
        "orders": [STORED_ORDER, [STORED_ORDER]],
        "one": {"order": STORED_ORDER, "returned": None, "weight": 0},
    }
    sent = Shipment(ORDER, returned=ORDER.model_copy(update={"id": 8}), weight=3)
    job_id = await ship.perform_later(sent)
    async with running(queue):
        assert (await queue.wait(job_id, timeout=15)).state is JobState.COMPLETED
    assert got == [sent] and type(got[0].order) is Order and type(got[0].returned) is Order


async def test_a_batch_of_models_is_stored_by_copy_and_by_insert_as_one_job_is(
    make_queue, admin
) -> None:
    queue = await make_queue()
    got: list[Order] = []
    plain = queue.handle("Plain", lambda args: None)

    @queue.handler("Order")
    def order(args: Order) -> None:
        got.append(args)

    models = [ORDER.model_copy(update={"id": n}) for n in range(20)]
    by_copy = [NewJob("Order", m) for m in models[:12]]
    by_insert = [order.job(m) for m in models[12:15]]
    assert copies(by_copy) and not copies(by_insert)
    ids = await queue.enqueue_all(by_copy)
    ids += await queue.enqueue_all(by_insert)
    ids += await queue.enqueue_all([plain.job({"orders": models[15:]})])
    assert [stored_args(admin, i) for i in ids[:15]] == [
        {**STORED_ORDER, "id": n} for n in range(15)
    ]
    assert stored_args(admin, ids[15]) == {
        "orders": [{**STORED_ORDER, "id": n} for n in range(15, 20)]
    }
    async with running(queue):
        for job_id in ids:
            assert (await queue.wait(job_id, timeout=15)).state is JobState.COMPLETED
    assert sorted(got, key=lambda m: m.id) == models[:15]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, populate_by_name=False)

    day: date
    ref: UUID
    name: str = Field(alias="fullName")


class Numbers(RootModel[list[int]]):
    pass


async def test_a_strict_model_an_aliased_one_and_a_root_model_round_trip_through_the_table(
    make_queue,
) -> None:
    queue = await make_queue()
    got: list[Any] = []

    @queue.handler("Strict")
    async def strict(args: Strict) -> None:
        got.append(args)

    @queue.handler("Numbers")
    async def numbers(args: Numbers) -> None:
        got.append(args)

    sent = [
        Strict(day=date(2026, 1, 2), ref=UUID(int=5), fullName="Ada"),
        Numbers([1, 2, 3]),
    ]
    ids = [await strict.perform_later(sent[0]), await numbers.perform_later(sent[1])]
    async with running(queue):
        for job_id in ids:
            assert (await queue.wait(job_id, timeout=15)).state is JobState.COMPLETED
    assert got == sent


@pytest.mark.parametrize(
    ("stored", "text"),
    [
        (
            {"issued": "2026-12-01", "lines": [{"sku": "a"}]},
            "Order needs fields 'id', 'lines[0].qty', which were not given",
        ),
        ({**STORED_ORDER, "id": SECRET}, "field 'id' is not valid (int_parsing)"),
        (
            {**STORED_ORDER, "lines": [{"sku": "a", "qty": 1}, {"sku": 5, "qty": SECRET}]},
            "field 'lines[1].sku' is not valid (string_type); "
            "field 'lines[1].qty' is not valid (int_parsing)",
        ),
        ({**STORED_ORDER, "tags": {"secret-" + SECRET: SECRET}}, "field 'tags[*]' is not valid"),
        (
            {**STORED_ORDER, "secret_" + SECRET: 1, "colour": 2},
            "it was given 2 keys that Order does not declare (not named here",
        ),
        ({**STORED_ORDER, "Ref": "bad " + SECRET}, "field 'Ref' is not valid (value_error)"),
        ([SECRET], "job 'Order' expects a JSON object for Order, got a JSON array"),
    ],
    ids=["missing", "wrong-type", "nested", "dict-key", "unknown-keys", "validator", "array"],
)
async def test_stored_arguments_that_do_not_fit_the_model_fail_the_job_naming_fields_not_values(
    make_queue, stored: Any, text: str
) -> None:
    queue = await make_queue(max_attempts=1)
    called: list[Any] = []

    @queue.handler("Order")
    async def order(args: Order) -> None:
        called.append(args)

    job_id = await queue.enqueue(NewJob("Order", stored))  # as another producer may write
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert info.state is JobState.FAILED and called == []
    error = info.error or ""
    assert error.startswith("TypeError: job 'Order'") and text in error, error
    assert SECRET not in error and "secret" not in error and "colour" not in error
    assert "input" not in error and "bad" not in error  # pydantic's own text is not used


async def test_a_model_inside_a_dataclass_that_does_not_fit_names_its_path(make_queue) -> None:
    queue = await make_queue(max_attempts=1)

    @queue.handler("Ship")
    async def ship(args: Shipment) -> None:
        raise AssertionError("not called")

    stored = {"order": STORED_ORDER, "returned": {**STORED_ORDER, "id": SECRET, "x": 1}}
    job_id = await queue.enqueue("Ship", stored)
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert info.state is JobState.FAILED, info.error
    assert info.error == (
        "TypeError: job 'Ship': field 'returned' does not fit Order: field 'returned' was "
        "given 1 key that Order does not declare (not named here: keys are arguments too); "
        "field 'returned.id' is not valid (int_parsing)"
    )


@pydantic_dataclass
class Card:
    holder: str
    code: str = Field(pattern=r"^[0-9]{4}$")


async def test_a_pydantic_dataclass_that_fails_its_own_checks_fails_the_job_without_the_value(
    make_queue,
) -> None:
    queue = await make_queue(max_attempts=1)
    got: list[Card] = []

    @queue.handler("Card")
    async def card(args: Card) -> None:
        got.append(args)

    fine = await card.perform_later(Card("Ada", "1234"))
    bad = await queue.enqueue("Card", {"holder": "Ada", "code": SECRET})
    async with running(queue):
        assert (await queue.wait(fine, timeout=15)).state is JobState.COMPLETED
        info = await queue.wait(bad, timeout=15)
    assert got == [Card("Ada", "1234")]
    assert info.error == (
        "TypeError: job 'Card': the arguments do not fit Card: "
        "field 'code' is not valid (string_pattern_mismatch)"
    )


class Reading(BaseModel):
    value: float
    label: str = ""


class Opaque(BaseModel):
    secret: str

    @field_serializer("secret")
    def _refuse(self, secret: str) -> str:
        raise ValueError(f"cannot show {secret}")


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (Reading(value=float("nan")), "they hold a number JSON cannot hold (NaN or infinity)"),
        ({"r": [Reading(value=1, label=SECRET + "\x00")]}, "a string holds a NUL character"),
        (Opaque(secret=SECRET), "they hold an Opaque that pydantic cannot dump as JSON"),
    ],
    ids=["nan", "nul", "serializer"],
)
def test_a_model_that_cannot_be_stored_is_refused_naming_the_job_and_never_a_value(
    args: Any, text: str, recwarn: pytest.WarningsRecorder
) -> None:
    with pytest.raises(ArgumentsError) as raised:
        NewJob("Reading", args)
    message = str(raised.value)
    assert message.startswith("the arguments of job 'Reading' cannot be queued: ")
    assert text in message and SECRET not in message, message
    assert not any(SECRET in str(w.message) for w in recwarn)


async def test_an_unvalidated_model_is_queued_without_a_warning_and_fails_its_handler_by_field(
    make_queue, recwarn: pytest.WarningsRecorder
) -> None:
    queue = await make_queue(max_attempts=1)

    @queue.handler("Reading")
    async def reading(args: Reading) -> None:
        raise AssertionError("not called")

    job_id = await reading.perform_later(Reading.model_construct(value=[SECRET]))
    assert not any(SECRET in str(w.message) for w in recwarn)  # pydantic's warning quotes it
    async with running(queue):
        info = await queue.wait(job_id, timeout=15)
    assert info.error == (
        "TypeError: job 'Reading': the arguments do not fit Reading: "
        "field 'value' is not valid (float_type)"
    )


async def test_a_job_of_a_model_shows_no_value_in_its_repr_or_its_info(make_queue) -> None:
    queue = await make_queue()
    secret = Order(id=1, issued=date(2026, 1, 1), Ref=SECRET)
    job = NewJob("Order", secret)
    assert SECRET not in repr(job) and SECRET not in str(job)
    info = await queue.job(await queue.enqueue(job))
    assert info is not None and SECRET not in repr(info)


async def test_a_handler_may_return_a_model_and_its_result_is_the_models_json(make_queue) -> None:
    queue = await make_queue()

    @queue.handler("Total")
    async def total(args: Order) -> Line:
        return Line(sku="sum", qty=sum(line.qty for line in args.lines))

    job_id = await total.perform_later(ORDER)
    async with running(queue):
        await queue.wait(job_id, timeout=15)
    assert await queue.result(job_id) == {"sku": "sum", "qty": 2}


class M(BaseModel):
    x: float


def test_a_refused_type_is_named_with_the_article_it_is_said_with() -> None:
    for value, said in [
        ({1}, "they hold a set, which JSON cannot hold"),
        (object(), "they hold an object, which JSON cannot hold"),
        ({"id": UUID(int=1)}, "they hold a UUID, which JSON cannot hold"),
        ({"e": OSError()}, "they hold an OSError, which JSON cannot hold"),
    ]:
        with pytest.raises(
            ArgumentsError, match=r"^the arguments of job 'X' cannot be queued: "
        ) as raised:
            NewJob("X", value)
        assert said in str(raised.value), str(raised.value)
    text, problem = result_json(M(x=float("inf")), "X")
    assert text is None and problem is not None, problem
    assert problem.startswith("job 'X' returned an M that cannot be stored as its result: ")


def test_queuing_and_decoding_without_models_never_imports_pydantic() -> None:
    program = """
import json, sys
from dataclasses import dataclass
from datetime import date
from axa_queue import NewJob, Queue
from axa_queue.jobs.typed import from_json

@dataclass
class Day:
    day: date
    ratio: float

def day(args: Day) -> None:
    pass

queue = Queue()
handler = queue.handle("Day", day)
for args in [{"a": [1, 2.5, None, "é"]}, Day(date(2026, 1, 1), 0.5), 1.5]:
    NewJob("Day", args)
for bad in [{1}, object()]:
    try:
        NewJob("Day", bad)
    except TypeError:
        pass
assert handler.decode({"day": "2026-01-01", "ratio": 1}) == Day(date(2026, 1, 1), 1.0)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("pydantic", "pydantic_core")))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
