"""The shop's own queue, with handlers of its own; the tasks join it when
`AXA_QUEUE["QUEUE"]` names it. `RenameGroup` and `RenameGroupAsync` update a row
through Django's ORM and tell which database session did it (its backend's pid)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.db import connection

from axa_queue import Queue

queue = Queue()


@queue.handler("Restock")
def restock(args: dict[str, Any]) -> int:
    """Count what came in."""
    return int(args["items"])


def _backend_pid() -> int:
    """The pid of the server process of this thread's Django connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@queue.handler("RenameGroup")
def rename_group(args: dict[str, str]) -> dict[str, int]:
    """An ORM `UPDATE` in the job's thread."""
    renamed = Group.objects.filter(name=args["name"]).update(name=args["to"])
    return {"renamed": renamed, "backend_pid": _backend_pid()}


@queue.handler("RenameGroupAsync")
async def rename_group_async(args: dict[str, str]) -> dict[str, int]:
    """An ORM `UPDATE` from async code (`aupdate`, through `sync_to_async`)."""
    renamed = await Group.objects.filter(name=args["name"]).aupdate(name=args["to"])
    return {"renamed": renamed, "backend_pid": await sync_to_async(_backend_pid)()}
