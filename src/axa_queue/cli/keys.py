"""`axa-queue counts --by-key NAME`: a job name's busiest keys (`NewJob.key`), each with
its ready, waiting and running jobs."""

from __future__ import annotations

from rich.table import Table

from ..jobs.keys import BUSIEST, KEYS_READ, KeyCounts
from ..queue import Queue
from .conventions import Printed, answer
from .text import shown

__all__ = ["by_key"]


def _table(name: str, found: list[KeyCounts]) -> Printed | list[Printed]:
    if not found:
        return f"no live job of {shown(name)} has a key"
    table = Table("KEY", "READY", "WAITING", "RUNNING", title=f"the busiest keys of {shown(name)}")
    plus = "+" if found[0].capped else ""
    for one in found:
        table.add_row(
            shown(one.key), f"{one.ready}{plus}", f"{one.waiting}{plus}", f"{one.running}{plus}"
        )
    if plus:
        return [table, f"+ at least: counted over the first {KEYS_READ:,} live keyed jobs read"]
    return table


def by_key(name: str, most: int, as_json: bool, dsn: str | None) -> None:
    """Print the `most` busiest keys of job `name` (a table, or JSON with `as_json`)."""

    async def work(queue: Queue) -> list[KeyCounts]:
        return await queue.key_counts(name, most)

    answer(dsn, work, lambda found: _table(name, found), as_json=as_json)


DEFAULT_MOST = BUSIEST
"""How many keys `counts --by-key` shows unless `--keys` says."""
