"""A job's key (`NewJob.key`): who the job is for (a tenant, a customer), the unit of
fairness of a name claimed by key (`Queue.limit_per_key`). Checked as a person's `by`
is (`acts.check_code`'s rule): a visible code, never echoed in an error (a key may name
a customer). Also what is read of a name's keys: `KeyCounts`, its busiest keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import sql
from ..db.calls import Call, Row
from ..errors import OptionsError

__all__ = [
    "BUSIEST",
    "KEYS_READ",
    "MAX_KEY_CHARS",
    "KeyCounts",
    "check_key",
    "key_counts_call",
    "key_ok",
]

MAX_KEY_CHARS = 200
"""The longest key, in characters."""


def check_key(key: object, job: str) -> str:
    """`key` when it can be a job's key: a `str` of 1 to `MAX_KEY_CHARS` characters,
    every one printable (`str.isprintable`: no control, format, zero-width or bidi
    character, no line separator, no space but the ASCII space), no space first or
    last; else an `OptionsError` naming the job and the rule, never the key."""
    if (
        isinstance(key, str)
        and 0 < len(key) <= MAX_KEY_CHARS
        and key.isprintable()
        and key[0] != " "
        and key[-1] != " "
    ):
        return key
    raise OptionsError(
        f"the key of job {job!r} cannot be used: a key is 1 to {MAX_KEY_CHARS} visible "
        "characters (letters, digits, punctuation, symbols, and ASCII spaces between "
        "them), with no control, zero-width or bidi character and no space first or "
        "last; nothing was queued"
    )


def key_ok(key: object, job: str) -> bool:
    """True when a job named `job` has no key, else its key checked (`check_key`)."""
    return key is None or bool(check_key(key, job))


@dataclass(frozen=True)
class KeyCounts:
    """One key's live jobs of a job name (`Queue.key_counts`): queued and due, queued for
    later, running. The key is shown to whoever reads the counts (the CLI, the
    dashboard): put an id in it, never a secret."""

    key: str
    ready: int = 0
    waiting: int = 0
    running: int = 0
    capped: bool = False
    """More than `KEYS_READ` of the name's live keyed jobs: the numbers are those of the
    jobs read, lower bounds."""
    of_all: tuple[int, int, int] = (0, 0, 0)
    """Ready, waiting and running jobs of every key read, this one and those not shown."""


BUSIEST = 10
"""How many keys `key_counts` returns by default: the busiest."""

KEYS_READ = 100_000
"""The most live keyed jobs of a name `key_counts` reads (`sql.KEY_COUNTS`' `cap`)."""


def key_counts_call(
    name: str, most: int = BUSIEST, now: datetime | None = None
) -> Call[list[KeyCounts]]:
    """The call that reads the busiest `most` keys of job `name` (`sql.KEY_COUNTS`): the
    most live jobs (queued and running) first."""

    def read(rows: list[Row], _count: int) -> list[KeyCounts]:
        return [
            KeyCounts(
                row.key,
                row.ready,
                row.waiting,
                row.running,
                row.capped,
                (int(row.all_ready), int(row.all_waiting), int(row.all_running)),
            )
            for row in rows
        ]

    return Call(sql.KEY_COUNTS, {"name": name, "most": most, "now": now, "cap": KEYS_READ}, read)
