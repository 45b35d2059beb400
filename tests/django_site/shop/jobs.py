"""The shop's own queue, with a handler of its own; the tasks join it when
`AXA_QUEUE["QUEUE"]` names it."""

from __future__ import annotations

from typing import Any

from axa_queue import Queue

queue = Queue()


@queue.handler("Restock")
def restock(args: dict[str, Any]) -> int:
    """Count what came in."""
    return int(args["items"])
